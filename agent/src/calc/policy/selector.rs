//! Kubernetes label selectors (`matchLabels` + `matchExpressions`).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// A validated label selector.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Selector {
    labels: BTreeMap<String, String>,
    expressions: Vec<Expression>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Expression {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

impl Selector {
    /// The empty selector: selects everything.
    #[must_use]
    pub fn everything() -> Self {
        Self::default()
    }

    /// Validates a Kubernetes selector.
    pub fn from_k8s(s: &LabelSelector) -> Result<Self, String> {
        for (key, value) in s.match_labels.iter().flatten() {
            label_key(key).map_err(|e| format!("matchLabels: {e}"))?;
            label_value(value).map_err(|e| format!("matchLabels[{key:?}]: {e}"))?;
        }
        let mut expressions = Vec::new();
        for e in s.match_expressions.iter().flatten() {
            label_key(&e.key).map_err(|err| format!("matchExpressions: {err}"))?;
            let values = e.values.clone().unwrap_or_default();
            for v in &values {
                label_value(v).map_err(|err| format!("matchExpressions on {:?}: {err}", e.key))?;
            }
            let expr = match e.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => {
                    return Err(format!(
                        "matchExpressions on {:?}: operator {} needs values",
                        e.key, e.operator
                    ));
                }
                "In" => Expression::In(e.key.clone(), values),
                "NotIn" => Expression::NotIn(e.key.clone(), values),
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    return Err(format!(
                        "matchExpressions on {:?}: operator {} takes no values",
                        e.key, e.operator
                    ));
                }
                "Exists" => Expression::Exists(e.key.clone()),
                "DoesNotExist" => Expression::DoesNotExist(e.key.clone()),
                other => {
                    return Err(format!(
                        "matchExpressions operator {other:?} is not In, NotIn, Exists or DoesNotExist"
                    ));
                }
            };
            expressions.push(expr);
        }
        Ok(Self {
            labels: s.match_labels.clone().unwrap_or_default(),
            expressions,
        })
    }

    /// True when `labels` match (an empty selector matches everything).
    #[must_use]
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.labels.iter().all(|(k, v)| labels.get(k) == Some(v))
            && self.expressions.iter().all(|e| match e {
                Expression::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
                Expression::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
                Expression::Exists(k) => labels.contains_key(k),
                Expression::DoesNotExist(k) => !labels.contains_key(k),
            })
    }
}

/// A label key as the API server validates it: an optional DNS-subdomain prefix (at most 253
/// characters) and `/`, then a name of at most 63 characters.
fn label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        let subdomain = !prefix.is_empty()
            && prefix.len() <= 253
            && prefix.split('.').all(|part| {
                !part.is_empty()
                    && part
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            });
        if !subdomain {
            return Err(format!(
                "label key {key:?}: the prefix before '/' must be a DNS subdomain (lowercase \
                 letters, digits, '-' and '.', at most 253 characters)"
            ));
        }
    }
    if name.is_empty() || !label_name_chars(name) {
        return Err(format!(
            "label key {key:?}: the name must be 1-63 characters of letters, digits, '-', '_' \
             and '.', starting and ending with a letter or digit"
        ));
    }
    Ok(())
}

/// A label value: empty, or at most 63 characters as a key's name.
fn label_value(value: &str) -> Result<(), String> {
    if value.is_empty() || label_name_chars(value) {
        Ok(())
    } else {
        Err(format!(
            "label value {value:?} must be at most 63 characters of letters, digits, '-', '_' \
             and '.', starting and ending with a letter or digit (or empty)"
        ))
    }
}

fn label_name_chars(s: &str) -> bool {
    let bytes = s.as_bytes();
    s.len() <= 63
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> LabelSelector {
        LabelSelector {
            match_labels: Some(
                pairs
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..LabelSelector::default()
        }
    }

    fn expression(key: &str, operator: &str, values: &[&str]) -> LabelSelector {
        LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: key.to_owned(),
                operator: operator.to_owned(),
                values: Some(values.iter().map(|v| (*v).to_owned()).collect()),
            }]),
            ..LabelSelector::default()
        }
    }

    #[test]
    fn valid_keys_and_values_pass() {
        for (k, v) in [
            ("app", "web"),
            ("kubernetes.io/metadata.name", "x"),
            ("a.b-c_d", ""),
            ("example.com/tier", "front.end-1"),
        ] {
            assert!(Selector::from_k8s(&labels(&[(k, v)])).is_ok(), "{k}={v}");
        }
        assert!(Selector::from_k8s(&expression("example.com/tier", "In", &["a", "b-2"])).is_ok());
    }

    #[test]
    fn invalid_keys_and_values_are_refused_with_the_reason() {
        let long = "a".repeat(64);
        for (k, v, needle) in [
            ("bad key", "x", "label key \"bad key\""),
            ("-app", "x", "label key"),
            (long.as_str(), "x", "label key"),
            ("Example.com/app", "x", "DNS subdomain"),
            ("/app", "x", "DNS subdomain"),
            ("example.com/", "x", "label key"),
            ("app", "two words", "label value"),
            ("app", long.as_str(), "label value"),
            ("app", "x-", "label value"),
        ] {
            let err = Selector::from_k8s(&labels(&[(k, v)])).expect_err(needle);
            assert!(err.contains(needle), "{k}={v}: {err}");
            assert!(err.starts_with("matchLabels"), "{err}");
        }
        let err = Selector::from_k8s(&expression("app", "In", &["a b"])).expect_err("value");
        assert!(
            err.contains("label value") && err.contains("\"app\""),
            "{err}"
        );
        let err = Selector::from_k8s(&expression("a b", "Exists", &[])).expect_err("key");
        assert!(err.contains("label key"), "{err}");
        let err = Selector::from_k8s(&expression("app", "In", &[])).expect_err("no values");
        assert!(err.contains("needs values"), "{err}");
        let err = Selector::from_k8s(&expression("app", "Exists", &["x"])).expect_err("values");
        assert!(err.contains("takes no values"), "{err}");
        let err = Selector::from_k8s(&expression("app", "Near", &[])).expect_err("operator");
        assert!(err.contains("operator \"Near\""), "{err}");
    }
}
