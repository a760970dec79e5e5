//! Judging a benchmark against its targets. Every benchmark declares its [`Target`]s in code, next to
//! the benchmark; after a run writes `target/weir-bench/NAME.json` the judge reads it, evaluates every
//! target, prints a verdict table and writes the targets, their verdicts, the load average before and
//! after, `smoke`, `commit` and `date` back into the JSON.
//!
//! A full run judges the real thresholds. A smoke run (tiny sizes) judges only that each real
//! target's figure is there and sane (finite, and > 0 unless declared otherwise); targets
//! declared [`Scope::Always`] (invariants such as "no duplicate addresses") keep their threshold in
//! smoke runs too. A target whose figure is missing is `absent`, which `--check` counts as a failure.

use std::{fmt, path::Path};

use serde_json::{Map, Value, json};

/// How a figure is compared with its threshold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cmp {
    Le,
    Ge,
    Lt,
    Gt,
}

impl Cmp {
    fn holds(self, figure: f64, threshold: f64) -> bool {
        match self {
            Self::Le => figure <= threshold,
            Self::Ge => figure >= threshold,
            Self::Lt => figure < threshold,
            Self::Gt => figure > threshold,
        }
    }

    pub(crate) fn symbol(self) -> &'static str {
        match self {
            Self::Le => "≤",
            Self::Ge => "≥",
            Self::Lt => "<",
            Self::Gt => ">",
        }
    }
}

/// What a figure is compared with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Threshold {
    /// A fixed value.
    Value(f64),
    /// `factor` × another figure of the same run (a peer such as `bridge`).
    Figure { key: &'static str, factor: f64 },
    /// The larger of a fixed value and `factor` × another figure of the same run (a bar that
    /// follows the disk, such as etcd's own fsync p99).
    ValueOrFigure {
        value: f64,
        key: &'static str,
        factor: f64,
    },
}

impl Threshold {
    /// The threshold's value in `figures`, or why it has none.
    fn resolve(self, figures: &Value) -> Result<f64, String> {
        match self {
            Self::Value(v) => Ok(v),
            Self::Figure { key, factor } => number(figures, key)
                .map(|v| factor * v)
                .ok_or_else(|| format!("its peer figure `{key}` is absent")),
            Self::ValueOrFigure { value, key, factor } => number(figures, key)
                .map(|v| value.max(factor * v))
                .ok_or_else(|| format!("its peer figure `{key}` is absent")),
        }
    }

    /// The figure this threshold is made of, if it names one.
    fn peer(self) -> Option<&'static str> {
        match self {
            Self::Value(_) => None,
            Self::Figure { key, .. } | Self::ValueOrFigure { key, .. } => Some(key),
        }
    }
}

impl fmt::Display for Threshold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let times = |factor: f64, key: &str| {
            if factor == 1.0 {
                key.to_owned()
            } else {
                format!("{} × {key}", number_text(factor))
            }
        };
        match *self {
            Self::Value(v) => f.write_str(&number_text(v)),
            Self::Figure { key, factor } => f.write_str(&times(factor, key)),
            Self::ValueOrFigure { value, key, factor } => {
                write!(f, "max({}, {})", number_text(value), times(factor, key))
            }
        }
    }
}

/// When a target's threshold applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scope {
    /// A real target: judged on full runs; smoke runs check only that its figure is sane.
    Full,
    /// An invariant: judged with its threshold on every run, smoke included.
    Always,
}

/// One target of a benchmark: `figure cmp threshold`, with why it is the target and where it
/// comes from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Target {
    /// The figure's key in the benchmark's JSON.
    pub(crate) figure: &'static str,
    pub(crate) cmp: Cmp,
    pub(crate) threshold: Threshold,
    /// Why this is the target.
    pub(crate) why: &'static str,
    /// Where the target comes from (an issue, or the BENCHMARKS.md section that states it).
    pub(crate) source: &'static str,
    pub(crate) scope: Scope,
    /// What a smoke run holds the figure to.
    pub(crate) sanity: Sanity,
}

/// What a smoke run requires of a real target's figure besides being present.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sanity {
    /// Finite and > 0: a duration, a rate, a ratio of two durations.
    Positive,
    /// Finite and ≥ 0: a figure tiny smoke sizes may round to 0.
    NonNegative,
    /// Finite: a ratio of two differences, which the noise of a smoke run may turn negative.
    Finite,
}

impl Sanity {
    fn holds(self, value: f64) -> bool {
        value.is_finite()
            && match self {
                Self::Positive => value > 0.0,
                Self::NonNegative => value >= 0.0,
                Self::Finite => true,
            }
    }

    fn text(self) -> &'static str {
        match self {
            Self::Positive => "present, finite, > 0",
            Self::NonNegative => "present, finite, ≥ 0",
            Self::Finite => "present, finite",
        }
    }
}

impl Target {
    /// A real target against a fixed value.
    pub(crate) const fn full(
        figure: &'static str,
        cmp: Cmp,
        threshold: f64,
        why: &'static str,
        source: &'static str,
    ) -> Self {
        Self::new(figure, cmp, Threshold::Value(threshold), why, source)
    }

    /// A real target against any [`Threshold`].
    pub(crate) const fn new(
        figure: &'static str,
        cmp: Cmp,
        threshold: Threshold,
        why: &'static str,
        source: &'static str,
    ) -> Self {
        Self {
            figure,
            cmp,
            threshold,
            why,
            source,
            scope: Scope::Full,
            sanity: Sanity::Positive,
        }
    }

    /// The same target, judged with its threshold on smoke runs too.
    pub(crate) const fn always(self) -> Self {
        Self {
            scope: Scope::Always,
            ..self
        }
    }

    /// The same target, whose figure may be 0 in a smoke run.
    pub(crate) const fn may_be_zero(self) -> Self {
        Self {
            sanity: Sanity::NonNegative,
            ..self
        }
    }

    /// The same target, whose figure may have either sign in a smoke run (a ratio of two
    /// differences against a baseline).
    pub(crate) const fn any_sign(self) -> Self {
        Self {
            sanity: Sanity::Finite,
            ..self
        }
    }

    /// `figure cmp threshold`, e.g. `established_ratio ≤ 3`.
    pub(crate) fn rule(&self) -> String {
        format!("{} {} {}", self.figure, self.cmp.symbol(), self.threshold)
    }
}

/// The impossible target `WEIR_BENCH_BREAK_TARGET=<bench>` adds to a benchmark, so that `--check`
/// must fail: its first target's figure below −∞, judged on smoke runs too.
pub(crate) fn impossible(targets: &[Target]) -> Target {
    let figure = targets.first().map_or("smoke", |t| t.figure);
    Target::full(
        figure,
        Cmp::Lt,
        f64::NEG_INFINITY,
        "deliberately impossible (WEIR_BENCH_BREAK_TARGET): proves that --check fails",
        "WEIR_BENCH_BREAK_TARGET",
    )
    .always()
}

/// A target's verdict in one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Met,
    Missed,
    Absent,
}

impl Verdict {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Met => "met",
            Self::Missed => "MISSED",
            Self::Absent => "absent",
        }
    }
}

/// One target evaluated against one run's figures.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Judged {
    pub(crate) target: Target,
    /// The figure, when the run has it as a number.
    pub(crate) figure: Option<f64>,
    /// What the figure was held to in this run (`≤ 3`, `present, finite, > 0`).
    pub(crate) applied: String,
    pub(crate) verdict: Verdict,
    /// Why the verdict is not `met` (empty when it is).
    pub(crate) detail: String,
}

/// A figure of the run as a number (`None` when absent, null or not a number).
pub(crate) fn number(figures: &Value, key: &str) -> Option<f64> {
    figures.get(key).and_then(Value::as_f64)
}

/// Evaluates `target` against `figures` (a full run unless `smoke`).
pub(crate) fn judge_one(target: &Target, figures: &Value, smoke: bool) -> Judged {
    let figure = number(figures, target.figure);
    let judged = |applied: String, verdict: Verdict, detail: String| Judged {
        target: *target,
        figure,
        applied,
        verdict,
        detail,
    };
    let Some(value) = figure else {
        let detail = match figures.get(target.figure) {
            None => format!("`{}` is not in the results", target.figure),
            Some(v) => format!("`{}` is not a number ({v})", target.figure),
        };
        return judged(String::new(), Verdict::Absent, detail);
    };
    if smoke && target.scope == Scope::Full {
        // Smoke sizes say nothing about the real threshold: the figure must only be sane, and a
        // peer it is measured against must be there too.
        let applied = target.sanity.text();
        if !target.sanity.holds(value) {
            return judged(
                applied.to_owned(),
                Verdict::Missed,
                format!("{} = {value} is not sane", target.figure),
            );
        }
        if let Some(peer) = target.threshold.peer()
            && number(figures, peer).is_none_or(|v| !v.is_finite())
        {
            return judged(
                applied.to_owned(),
                Verdict::Absent,
                format!("its peer figure `{peer}` is absent"),
            );
        }
        return judged(applied.to_owned(), Verdict::Met, String::new());
    }
    let bar = match target.threshold.resolve(figures) {
        Ok(bar) => bar,
        Err(detail) => return judged(String::new(), Verdict::Absent, detail),
    };
    let applied = format!("{} {}", target.cmp.symbol(), number_text(bar));
    if value.is_finite() && target.cmp.holds(value, bar) {
        judged(applied, Verdict::Met, String::new())
    } else {
        let detail = format!(
            "{} = {} is not {applied}",
            target.figure,
            number_text(value)
        );
        judged(applied, Verdict::Missed, detail)
    }
}

/// Evaluates every target.
pub(crate) fn judge(targets: &[Target], figures: &Value, smoke: bool) -> Vec<Judged> {
    targets
        .iter()
        .map(|t| judge_one(t, figures, smoke))
        .collect()
}

/// The verdict table: target | figure | threshold | verdict.
pub(crate) fn table(bench: &str, judged: &[Judged], smoke: bool) -> String {
    let rows: Vec<[String; 4]> = judged
        .iter()
        .map(|j| {
            [
                j.target.rule(),
                j.figure.map_or_else(|| "-".to_owned(), number_text),
                if j.applied.is_empty() {
                    "-".to_owned()
                } else {
                    j.applied.clone()
                },
                j.verdict.as_str().to_owned(),
            ]
        })
        .collect();
    let header = [
        format!("{bench} targets{}", if smoke { " (smoke)" } else { "" }),
        "figure".to_owned(),
        "threshold".to_owned(),
        "verdict".to_owned(),
    ];
    let width = |i: usize| {
        rows.iter()
            .chain(std::iter::once(&header))
            .map(|r| r[i].chars().count())
            .max()
            .unwrap_or(0)
    };
    let widths = [width(0), width(1), width(2)];
    let line = |r: &[String; 4]| {
        let pad = |s: &str, w: usize| format!("{s}{}", " ".repeat(w - s.chars().count()));
        format!(
            "{}  {}  {}  {}\n",
            pad(&r[0], widths[0]),
            pad(&r[1], widths[1]),
            pad(&r[2], widths[2]),
            r[3]
        )
    };
    let mut out = line(&header);
    for r in &rows {
        out.push_str(&line(r));
    }
    out
}

/// What the judge adds to a run's JSON beside its figures.
pub(crate) struct RunInfo {
    pub(crate) smoke: bool,
    pub(crate) load_before: Option<[f64; 3]>,
    pub(crate) load_after: Option<[f64; 3]>,
    pub(crate) commit: Option<String>,
    pub(crate) date: Option<String>,
}

/// Writes the targets with their verdicts and the run's facts into `figures`.
pub(crate) fn annotate(figures: &mut Value, judged: &[Judged], info: &RunInfo) {
    let targets: Vec<Value> = judged
        .iter()
        .map(|j| {
            json!({
                "figure": j.target.figure,
                "comparison": j.target.cmp.symbol(),
                "threshold": j.target.threshold.to_string(),
                "why": j.target.why,
                "source": j.target.source,
                "scope": match j.target.scope { Scope::Full => "full", Scope::Always => "always" },
                "value": j.figure,
                "applied": j.applied,
                "verdict": j.verdict.as_str(),
            })
        })
        .collect();
    if !figures.is_object() {
        *figures = Value::Object(Map::new());
    }
    if let Some(map) = figures.as_object_mut() {
        map.insert("targets".into(), Value::Array(targets));
        map.insert("smoke".into(), json!(info.smoke));
        map.insert("load_before".into(), json!(info.load_before));
        map.insert("load_after".into(), json!(info.load_after));
        map.insert("commit".into(), json!(info.commit));
        map.insert("date".into(), json!(info.date));
    }
}

/// The failures `--check` reports: every target not met, one line each.
pub(crate) fn failures(bench: &str, judged: &[Judged]) -> Vec<String> {
    judged
        .iter()
        .filter(|j| j.verdict != Verdict::Met)
        .map(|j| {
            format!(
                "{bench}: {} {} ({}; why: {})",
                j.target.rule(),
                j.verdict.as_str(),
                j.detail,
                j.target.why
            )
        })
        .collect()
}

/// The 1, 5 and 15 minute load averages.
pub(crate) fn loadavg() -> Option<[f64; 3]> {
    parse_loadavg(&std::fs::read_to_string("/proc/loadavg").ok()?)
}

fn parse_loadavg(text: &str) -> Option<[f64; 3]> {
    let mut it = text.split_whitespace().map(|f| f.parse::<f64>().ok());
    Some([it.next()??, it.next()??, it.next()??])
}

/// The checked-out commit (short hash, `-dirty` when the tree has changes), if git can tell.
pub(crate) fn commit(ws: &Path) -> Option<String> {
    let ws = ws.to_str()?;
    let hash = crate::util::output("git", &["-C", ws, "rev-parse", "--short", "HEAD"])?;
    let dirty = crate::util::output(
        "git",
        &["-C", ws, "status", "--porcelain", "--untracked-files=no"],
    )
    .is_some_and(|s| !s.trim().is_empty());
    Some(format!(
        "{}{}",
        hash.trim(),
        if dirty { "-dirty" } else { "" }
    ))
}

/// Now, UTC, as `2026-12-07T17:30:00Z`.
pub(crate) fn now() -> Option<String> {
    crate::util::output("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]).map(|s| s.trim().to_owned())
}

/// A number as a table shows it: integers without decimals, others to 3 significant decimals.
pub(crate) fn number_text(v: f64) -> String {
    if v.is_infinite() {
        return if v > 0.0 { "∞" } else { "−∞" }.to_owned();
    }
    if v.fract() == 0.0 && v.abs() < 1e15 {
        return format!("{v:.0}");
    }
    let text = if v.abs() >= 100.0 {
        format!("{v:.1}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    };
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TARGETS: &[Target] = &[
        Target::full("ratio", Cmp::Le, 3.0, "why", "test"),
        Target::new(
            "weir_ms",
            Cmp::Le,
            Threshold::Figure {
                key: "bridge_ms",
                factor: 2.0,
            },
            "peer",
            "test",
        ),
        Target::full("duplicates", Cmp::Le, 0.0, "never", "test")
            .always()
            .may_be_zero(),
        Target::new(
            "p99_ms",
            Cmp::Le,
            Threshold::ValueOrFigure {
                value: 10.0,
                key: "fsync_ms",
                factor: 2.0,
            },
            "disk",
            "test",
        ),
    ];

    fn verdicts(figures: &Value, smoke: bool) -> Vec<Verdict> {
        judge(TARGETS, figures, smoke)
            .iter()
            .map(|j| j.verdict)
            .collect()
    }

    #[test]
    fn full_runs_judge_the_thresholds() {
        let ok = json!({"ratio": 3.0, "weir_ms": 20.0, "bridge_ms": 10.0, "duplicates": 0, "p99_ms": 12.0, "fsync_ms": 6.0});
        assert_eq!(verdicts(&ok, false), [Verdict::Met; 4]);
        let bad = json!({"ratio": 3.01, "weir_ms": 20.1, "bridge_ms": 10.0, "duplicates": 1, "p99_ms": 10.5, "fsync_ms": 2.0});
        assert_eq!(verdicts(&bad, false), [Verdict::Missed; 4]);
    }

    #[test]
    fn a_missing_figure_or_peer_is_absent_never_met() {
        let figures = json!({"weir_ms": 1.0, "duplicates": 0, "p99_ms": 1.0, "ratio": null});
        let v = verdicts(&figures, false);
        assert_eq!(
            v,
            [
                Verdict::Absent,
                Verdict::Absent,
                Verdict::Met,
                Verdict::Absent
            ]
        );
        let failed = failures("x", &judge(TARGETS, &figures, false));
        assert_eq!(failed.len(), 3, "{failed:?}");
        assert!(failed[0].contains("ratio ≤ 3 absent"), "{failed:?}");
        assert!(failed[1].contains("bridge_ms"), "{failed:?}");
    }

    #[test]
    fn smoke_runs_check_sanity_and_keep_invariants() {
        // Far over the real thresholds, but sane: met in a smoke run, missed in a full one.
        let figures = json!({"ratio": 30.0, "weir_ms": 500.0, "bridge_ms": 1.0, "duplicates": 0, "p99_ms": 99.0, "fsync_ms": 1.0});
        assert_eq!(verdicts(&figures, true), [Verdict::Met; 4]);
        assert_eq!(
            verdicts(&figures, false),
            [
                Verdict::Missed,
                Verdict::Missed,
                Verdict::Met,
                Verdict::Missed
            ]
        );
        // A duration of 0, a peer missing, an invariant broken: all fail a smoke run.
        let broken =
            json!({"ratio": 0.0, "weir_ms": 5.0, "duplicates": 2, "p99_ms": 1.0, "fsync_ms": 1.0});
        assert_eq!(
            verdicts(&broken, true),
            [
                Verdict::Missed,
                Verdict::Absent,
                Verdict::Missed,
                Verdict::Met
            ]
        );
    }

    #[test]
    fn smoke_sanity_follows_the_declaration() {
        let figures = json!({"d": -2.0, "z": 0.0});
        let t = |figure| Target::full(figure, Cmp::Ge, 100.0, "w", "test");
        assert_eq!(judge_one(&t("d"), &figures, true).verdict, Verdict::Missed);
        assert_eq!(
            judge_one(&t("d").any_sign(), &figures, true).verdict,
            Verdict::Met
        );
        assert_eq!(judge_one(&t("z"), &figures, true).verdict, Verdict::Missed);
        assert_eq!(
            judge_one(&t("z").may_be_zero(), &figures, true).verdict,
            Verdict::Met
        );
        assert_eq!(
            judge_one(&t("d").may_be_zero(), &figures, true).verdict,
            Verdict::Missed
        );
        // A full run judges the threshold whatever the declaration.
        assert_eq!(
            judge_one(&t("d").any_sign(), &figures, false).verdict,
            Verdict::Missed
        );
    }

    #[test]
    fn the_impossible_target_fails_smoke_and_full_runs() {
        let t = impossible(TARGETS);
        assert_eq!(t.figure, "ratio");
        let figures = json!({"ratio": 1.0});
        for smoke in [true, false] {
            let j = judge_one(&t, &figures, smoke);
            assert_eq!(j.verdict, Verdict::Missed, "smoke={smoke}");
        }
        // Its positive control: the same figure meets the real target.
        assert_eq!(
            judge_one(&TARGETS[0], &figures, false).verdict,
            Verdict::Met
        );
    }

    #[test]
    fn annotate_writes_targets_and_run_facts() {
        let mut figures = json!({"ratio": 2.0});
        let judged = judge(&TARGETS[..1], &figures, false);
        let info = RunInfo {
            smoke: false,
            load_before: Some([1.0, 2.0, 3.0]),
            load_after: None,
            commit: Some("abc1234".into()),
            date: Some("2026-12-07T17:00:00Z".into()),
        };
        annotate(&mut figures, &judged, &info);
        assert_eq!(figures["targets"][0]["verdict"], "met");
        assert_eq!(figures["targets"][0]["comparison"], "≤");
        assert_eq!(figures["targets"][0]["threshold"], "3");
        assert_eq!(figures["load_before"], json!([1.0, 2.0, 3.0]));
        assert_eq!(figures["load_after"], Value::Null);
        assert_eq!(figures["commit"], "abc1234");
        assert_eq!(figures["smoke"], false);
        assert_eq!(figures["ratio"], 2.0);
    }

    #[test]
    fn loadavg_and_numbers_parse_and_print() {
        assert_eq!(
            parse_loadavg("1.96 2.01 4.62 1/234 5678\n"),
            Some([1.96, 2.01, 4.62])
        );
        assert_eq!(parse_loadavg("garbage"), None);
        assert_eq!(number_text(5000.0), "5000");
        assert_eq!(number_text(1.15), "1.15");
        assert_eq!(number_text(0.0425), "0.043");
        assert_eq!(number_text(123.456), "123.5");
        assert!(table("x", &judge(TARGETS, &json!({}), false), false).contains("absent"));
    }
}
