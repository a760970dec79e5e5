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
    /// Validates a Kubernetes selector.
    pub fn from_k8s(s: &LabelSelector) -> Result<Self, String> {
        let mut expressions = Vec::new();
        for e in s.match_expressions.iter().flatten() {
            let values = e.values.clone().unwrap_or_default();
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
