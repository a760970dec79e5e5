//! Node and namespace selectors: `all()`, `k == "v"`, `k != "v"`, `has(k)`, `!has(k)`, joined by `&&`.

use std::collections::BTreeMap;

/// A selector that could not be parsed.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot parse selector term {term:?}: write `all()`, `key == \"value\"`, `key != \"value\"`, `has(key)` or \
     `!has(key)`, joined by `&&`"
)]
pub struct SelectorError {
    /// The term that did not parse.
    pub term: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Term {
    Eq(String, String),
    Ne(String, String),
    Has(String),
    NotHas(String),
}

/// A parsed selector.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Selector {
    terms: Vec<Term>,
}

impl Selector {
    /// Parses `expr`; an empty expression or `all()` selects everything.
    pub fn parse(expr: &str) -> Result<Self, SelectorError> {
        let mut terms = Vec::new();
        for raw in expr.split("&&") {
            let t = raw.trim();
            if t.is_empty() || t == "all()" {
                if t.is_empty() && expr.trim() != "" {
                    return Err(SelectorError {
                        term: raw.to_owned(),
                    });
                }
                continue;
            }
            terms.push(parse_term(t).ok_or_else(|| SelectorError { term: t.to_owned() })?);
        }
        Ok(Self { terms })
    }

    /// Whether a set of labels matches.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.terms.iter().all(|t| match t {
            Term::Eq(k, v) => labels.get(k) == Some(v),
            Term::Ne(k, v) => labels.get(k) != Some(v),
            Term::Has(k) => labels.contains_key(k),
            Term::NotHas(k) => !labels.contains_key(k),
        })
    }
}

fn parse_term(t: &str) -> Option<Term> {
    if let Some(inner) = t.strip_prefix("!has(").and_then(|r| r.strip_suffix(')')) {
        return label_key(inner).map(Term::NotHas);
    }
    if let Some(inner) = t.strip_prefix("has(").and_then(|r| r.strip_suffix(')')) {
        return label_key(inner).map(Term::Has);
    }
    let (op_ne, parts) = match t.split_once("!=") {
        Some(p) => (true, p),
        None => (false, t.split_once("==")?),
    };
    let key = label_key(parts.0)?;
    let v = parts.1.trim();
    let value = v
        .strip_prefix('"')
        .and_then(|r| r.strip_suffix('"'))
        .or_else(|| v.strip_prefix('\'').and_then(|r| r.strip_suffix('\'')))?;
    Some(if op_ne {
        Term::Ne(key, value.to_owned())
    } else {
        Term::Eq(key, value.to_owned())
    })
}

fn label_key(s: &str) -> Option<String> {
    let k = s.trim();
    let ok = !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c));
    ok.then(|| k.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn selectors_match_labels() {
        let l = labels(&[("foo", "bar"), ("zone", "a")]);
        assert!(Selector::parse("").expect("empty").matches(&l));
        assert!(Selector::parse("all()").expect("all").matches(&l));
        assert!(Selector::parse("foo == \"bar\"").expect("eq").matches(&l));
        assert!(!Selector::parse("foo != 'bar'").expect("ne").matches(&l));
        assert!(
            Selector::parse("has(zone) && !has(gpu)")
                .expect("has")
                .matches(&l)
        );
        assert!(!Selector::parse("has(gpu)").expect("has").matches(&l));
    }

    #[test]
    fn bad_selectors_are_errors() {
        for bad in ["foo = bar", "foo == bar", "&&", "has()", "foo == \"x\" &&"] {
            assert!(Selector::parse(bad).is_err(), "{bad} should not parse");
        }
    }
}
