//! Bounded waits on a condition: poll it until it holds, fail the test naming what did not happen
//! once the bound has passed. Tests wait on outcomes with these, never on a bare sleep.

use std::{
    fmt::Debug,
    thread::sleep,
    time::{Duration, Instant},
};

/// How often a condition is polled.
const POLL: Duration = Duration::from_millis(100);

/// Polls `done` until it returns a value or `within` has passed (then its last reason).
fn poll<T>(within: Duration, mut done: impl FnMut() -> Result<T, String>) -> Result<T, String> {
    let deadline = Instant::now() + within;
    loop {
        match done() {
            Ok(v) => return Ok(v),
            Err(why) if Instant::now() >= deadline => return Err(why),
            Err(_) => sleep(POLL),
        }
    }
}

/// Polls `done` until it returns a value, which it returns; panics with `what` and the last
/// reason `done` gave once `within` has passed.
pub fn until_ok<T>(what: &str, within: Duration, done: impl FnMut() -> Result<T, String>) -> T {
    poll(within, done).unwrap_or_else(|why| panic!("{what} within {within:?}: {why}"))
}

/// Polls `ok` until it holds; panics with `what` once `within` has passed.
pub fn until(what: &str, within: Duration, ok: impl FnMut() -> bool) {
    until_or_show(what, within, ok, String::new);
}

/// Polls `f` until it gives a value, which it returns; panics with `what` once `within` has
/// passed.
pub fn until_some<T>(what: &str, within: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    poll(within, || f().ok_or_else(String::new))
        .unwrap_or_else(|_| panic!("{what} within {within:?}"))
}

/// [`until`] whose failure also shows `context()` (logs, state), read only when it fails.
pub fn until_or_show(
    what: &str,
    within: Duration,
    mut ok: impl FnMut() -> bool,
    context: impl Fn() -> String,
) {
    if poll(within, || if ok() { Ok(()) } else { Err(String::new()) }).is_err() {
        panic!("{what} within {within:?}{}", shown(&context));
    }
}

/// Polls `get` until it equals `want`; panics with `what`, the last value and `want` once
/// `within` has passed.
pub fn until_eq<T, W>(what: &str, within: Duration, want: &W, get: impl FnMut() -> T)
where
    T: PartialEq<W> + Debug,
    W: Debug + ?Sized,
{
    until_eq_or_show(what, within, want, get, String::new);
}

/// [`until_eq`] whose failure also shows `context()` (logs, state), read only when it fails.
pub fn until_eq_or_show<T, W>(
    what: &str,
    within: Duration,
    want: &W,
    mut get: impl FnMut() -> T,
    context: impl Fn() -> String,
) where
    T: PartialEq<W> + Debug,
    W: Debug + ?Sized,
{
    let last = poll(within, || {
        let got = get();
        if got == *want {
            Ok(())
        } else {
            Err(format!("{got:#?}"))
        }
    });
    if let Err(got) = last {
        panic!(
            "{what} within {within:?}: got {got}, want {want:#?}{}",
            shown(&context)
        );
    }
}

/// `context()` on a line of its own, or nothing when it is empty.
fn shown(context: &impl Fn() -> String) -> String {
    let text = context();
    if text.is_empty() {
        text
    } else {
        format!("\n{text}")
    }
}

#[cfg(test)]
mod tests {
    use std::{panic, time::Duration};

    use super::{until, until_eq, until_ok, until_some};

    const SHORT: Duration = Duration::from_millis(300);

    /// The panic message of `f`, which must panic.
    fn panic_message(f: impl FnOnce() + panic::UnwindSafe) -> String {
        let payload = panic::catch_unwind(f).expect_err("it panics");
        payload
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default()
    }

    #[test]
    fn a_condition_that_comes_true_returns_its_value() {
        let mut calls = 0;
        let got = until_ok("the third call", SHORT * 10, || {
            calls += 1;
            if calls == 3 {
                Ok(calls)
            } else {
                Err(format!("call {calls}"))
            }
        });
        assert_eq!(got, 3);
        let mut left = 2;
        assert_eq!(
            until_some("a value", SHORT * 10, || {
                left -= 1;
                (left == 0).then_some("v")
            }),
            "v"
        );
    }

    #[test]
    fn a_condition_that_never_holds_fails_naming_it_and_its_last_state() {
        let message = panic_message(|| until("the never condition", SHORT, || false));
        assert!(
            message.starts_with("the never condition within"),
            "{message}"
        );
        let message = panic_message(|| until_eq("the count", SHORT, &2, || 1));
        assert!(message.contains("the count within"), "{message}");
        assert!(message.contains("got 1, want 2"), "{message}");
        let message = panic_message(|| {
            until_ok::<()>("the reason", SHORT, || Err("still 7".to_owned()));
        });
        assert!(message.ends_with(": still 7"), "{message}");
    }
}
