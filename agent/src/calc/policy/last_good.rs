//! A bad document refuses only itself: the object it meant keeps its last good form (if it had
//! one), and every other document applies. When the document cannot be told (a YAML syntax
//! error stops the reading of the rest of its file; an unreadable file), every object its file
//! held before and that no good document has now keeps its last good form.

use std::collections::BTreeSet;

use super::load::{Loaded, ObjectRef};

/// `now`, with the refused objects in their form of `last` (what was applied before).
#[must_use]
pub fn merge(mut now: Loaded, last: &Loaded) -> Loaded {
    let mut keep: BTreeSet<ObjectRef> = BTreeSet::new();
    for (file, object) in &now.refused {
        match object {
            Some(object) => {
                keep.insert(object.clone());
            }
            None => keep.extend(
                last.origins
                    .iter()
                    .filter(|(_, origin)| *origin == file)
                    .map(|(object, _)| object.clone()),
            ),
        }
    }
    for object in keep {
        if now.origins.contains_key(&object) {
            continue;
        }
        let Some(origin) = last.origins.get(&object) else {
            continue;
        };
        let kept = match &object {
            ObjectRef::Policy(ns, name) => {
                let key = (ns.clone(), name.clone());
                last.set.policies.get(&key).cloned().map(|p| {
                    now.set.policies.insert(key, p);
                })
            }
            ObjectRef::Namespace(name) => last.set.namespaces.get(name).cloned().map(|l| {
                now.set.namespaces.insert(name.clone(), l);
                if let Some(a) = last.set.namespace_annotations.get(name) {
                    now.set
                        .namespace_annotations
                        .insert(name.clone(), a.clone());
                }
            }),
            ObjectRef::Pod(ns, name) => {
                let key = (ns.clone(), name.clone());
                last.set.pods.get(&key).cloned().map(|p| {
                    now.set.pods.insert(key, p);
                })
            }
            ObjectRef::Node(name) => last.set.nodes.get(name).cloned().map(|n| {
                now.set.nodes.insert(name.clone(), n);
            }),
            ObjectRef::Service(ns, name) => {
                let key = (ns.clone(), name.clone());
                last.set.services.get(&key).cloned().map(|s| {
                    now.set.services.insert(key, s);
                })
            }
            ObjectRef::EndpointSlice(ns, name) => {
                let key = (ns.clone(), name.clone());
                last.set.endpoint_slices.get(&key).cloned().map(|s| {
                    now.set.endpoint_slices.insert(key, s);
                })
            }
        };
        if kept.is_some() {
            if let Some(line) = last.lines.get(&object) {
                now.lines.insert(object.clone(), *line);
            }
            now.origins.insert(object, origin.clone());
        }
    }
    now
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn load(files: &[(&str, &str)]) -> Loaded {
        let dir = tempfile::tempdir().expect("tmp");
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).expect("write");
        }
        let mut loaded = super::super::load::load_dir_full(dir.path());
        // Paths relative to the directory, so two loads compare.
        let strip = |p: &Path| p.file_name().map(Into::into).unwrap_or_default();
        loaded.origins = loaded
            .origins
            .into_iter()
            .map(|(o, p)| (o, strip(&p)))
            .collect();
        loaded.refused = loaded
            .refused
            .into_iter()
            .map(|(p, o)| (strip(&p), o))
            .collect();
        loaded
    }

    const GOOD: &str = "kind: NetworkPolicy\nmetadata: {name: a, namespace: prod}\nspec: {podSelector: {}, ingress: [{ports: [{port: 80}]}]}\n---\nkind: Pod\nmetadata: {name: web, namespace: prod, labels: {app: web}}\n";

    #[test]
    fn a_bad_document_keeps_its_last_good_form_and_the_rest_applies() {
        let last = load(&[("p.yaml", GOOD)]);
        assert!(last.errors.is_empty());
        // The policy breaks, the pod is relabelled: the pod's change applies, the policy stays.
        let now = load(&[(
            "p.yaml",
            "kind: NetworkPolicy\nmetadata: {name: a, namespace: prod}\nspec: {podSelector: {}, ingress: [{ports: [{port: 0}]}]}\n---\nkind: Pod\nmetadata: {name: web, namespace: prod, labels: {app: db}}\n---\nkind: NetworkPolicy\nmetadata: {name: new, namespace: prod}\nspec: {podSelector: {}, ingress: [{ports: [{port: 99999}]}]}\n",
        )]);
        assert_eq!(now.errors.len(), 2);
        let merged = merge(now, &last);
        let key = ("prod".to_owned(), "a".to_owned());
        assert_eq!(
            merged.set.policies[&key], last.set.policies[&key],
            "last good form"
        );
        assert_eq!(
            merged.set.pods[&("prod".into(), "web".into())].labels["app"],
            "db"
        );
        assert!(
            !merged
                .set
                .policies
                .contains_key(&("prod".into(), "new".into())),
            "a bad document that never was good applies nothing"
        );
        assert_eq!(merged.errors.len(), 2, "both are still reported");
    }

    #[test]
    fn a_syntax_error_keeps_what_the_file_held() {
        let last = load(&[
            ("p.yaml", GOOD),
            ("q.yaml", "kind: Namespace\nmetadata: {name: q}\n"),
        ]);
        let now = load(&[
            ("p.yaml", "a: [unclosed\n"),
            ("q.yaml", "kind: Namespace\nmetadata: {name: q2}\n"),
        ]);
        let merged = merge(now, &last);
        assert!(
            merged
                .set
                .policies
                .contains_key(&("prod".into(), "a".into()))
        );
        assert!(merged.set.pods.contains_key(&("prod".into(), "web".into())));
        assert!(
            merged.set.namespaces.contains_key("q2") && !merged.set.namespaces.contains_key("q"),
            "another file's edits apply"
        );
    }
}
