//! Contract tests of the Kubernetes store against request/response sequences written from the Kubernetes API
//! conventions, through kube-rs on a `tower_test::mock::pair` (no API server runs here).
//!
//! Two kinds of test: scripted exchanges (each request checked, each response written out), and a fake API
//! server that keeps objects and resourceVersions the way the conventions say (409 `Conflict` on a stale
//! resourceVersion, 409 `AlreadyExists`, 404 `NotFound`, delete preconditions, label selectors), so a whole
//! allocation can run through the allocator and its request sequence be checked.

use std::{
    collections::{BTreeMap, VecDeque},
    sync::{Arc, Mutex},
};

use http::{Method, Request, Response, StatusCode};
use ipam::{
    AssignArgs, Ipam,
    model::{IpPool, IpUse},
    store::{
        Key, Kind, Op, Revision, Store, StoreError, Write,
        kubernetes::{HOST_LABEL, KubeStore, NAME_ANNOTATION, host_hash, object_name},
    },
};
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock::{self, Handle};

const BASE: &str = "/apis/ipam.weir.dev/v1";

type Mock = Handle<Request<Body>, Response<Body>>;

fn store() -> (KubeStore, Mock) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    (
        KubeStore::new(kube::Client::new(service, "default")),
        handle,
    )
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code,
    })
}

fn object(kind: &str, name: &str, store_name: &str, rv: u64, spec: Value) -> Value {
    json!({
        "apiVersion": "ipam.weir.dev/v1", "kind": kind,
        "metadata": {
            "name": name, "resourceVersion": rv.to_string(), "uid": format!("uid-{name}"),
            "annotations": { NAME_ANNOTATION: store_name },
        },
        "spec": spec,
    })
}

/// One request as the API server sees it.
#[derive(Debug)]
struct Seen {
    method: Method,
    path: String,
    query: String,
    body: Value,
}

async fn next(handle: &mut Mock) -> (Seen, mock::SendResponse<Response<Body>>) {
    let (req, send) = handle
        .next_request()
        .await
        .expect("the client sent a request");
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let bytes = req.into_body().collect_bytes().await.expect("request body");
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).expect("request body is JSON")
    };
    let seen = Seen {
        method,
        path,
        query,
        body,
    };
    assert_rbac_covers(&seen);
    (seen, send)
}

/// Every request the store makes is one the ClusterRole grants: its verb is in
/// `kubernetes::RBAC_VERBS` and its resource in `kubernetes::rbac_resources()`.
fn assert_rbac_covers(seen: &Seen) {
    let rest = seen
        .path
        .strip_prefix(&format!("{BASE}/"))
        .unwrap_or_else(|| panic!("{} is outside the ipam.weir.dev group", seen.path));
    let (resource, name) = match rest.split_once('/') {
        Some((resource, name)) => (resource, Some(name)),
        None => (rest, None),
    };
    let verb = match (&seen.method, name) {
        (&Method::GET, Some(_)) => "get",
        (&Method::GET, None) if seen.query.contains("watch=") => "watch",
        (&Method::GET, None) => "list",
        (&Method::POST, _) => "create",
        (&Method::PUT, _) => "update",
        (&Method::PATCH, _) => "patch",
        (&Method::DELETE, _) => "delete",
        (m, _) => panic!("unexpected method {m}"),
    };
    assert!(
        ipam::store::kubernetes::RBAC_VERBS.contains(&verb),
        "{} {} is verb {verb}, which RBAC_VERBS (and so the ClusterRole) does not grant",
        seen.method,
        seen.path
    );
    assert!(
        ipam::store::kubernetes::rbac_resources()
            .iter()
            .any(|r| r == resource),
        "{resource} is not in rbac_resources()"
    );
}

fn respond(send: mock::SendResponse<Response<Body>>, code: u16, body: &Value) {
    send.send_response(
        Response::builder()
            .status(StatusCode::from_u16(code).expect("status code"))
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(body).expect("json")))
            .expect("response"),
    );
}

fn query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == name).then(|| {
            v.replace("%2F", "/")
                .replace("%3D", "=")
                .replace("%2C", ",")
                .replace('+', " ")
        })
    })
}

// ---------------------------------------------------------------------------------------------------------------
// Scripted exchanges.

#[tokio::test]
async fn get_reads_the_spec_and_resource_version_and_404_is_absent() {
    let (s, mut h) = store();
    let server = tokio::spawn(async move {
        let (r, send) = next(&mut h).await;
        assert_eq!(r.method, Method::GET);
        assert_eq!(r.path, format!("{BASE}/ippools/pool-a"));
        respond(
            send,
            200,
            &object("IPPool", "pool-a", "pool-a", 42, json!({"name": "pool-a"})),
        );
        let (r, send) = next(&mut h).await;
        assert_eq!(r.path, format!("{BASE}/ippools/pool-b"));
        respond(
            send,
            404,
            &status(
                404,
                "NotFound",
                "ippools.ipam.weir.dev \"pool-b\" not found",
            ),
        );
    });
    let got = s.get(&Key::new(Kind::Pool, "pool-a")).await.expect("get");
    let got = got.expect("present");
    assert_eq!(got.revision, Revision(42));
    assert_eq!(
        serde_json::from_slice::<Value>(&got.value).expect("json"),
        json!({"name": "pool-a"})
    );
    assert_eq!(
        s.get(&Key::new(Kind::Pool, "pool-b")).await.expect("get"),
        None
    );
    server.await.expect("server");
}

#[tokio::test]
async fn a_hosts_affinities_are_listed_by_hashed_host_label_and_pages_are_followed() {
    let (s, mut h) = store();
    let host = "node-1";
    let mine = format!("{host}/10.0.0.0-26");
    let other = "node-10/10.0.1.0-26"; // same hash in this script: must be filtered by name
    let (m, o) = (mine.clone(), other.to_owned());
    let server = tokio::spawn(async move {
        let (r, send) = next(&mut h).await;
        assert_eq!(r.method, Method::GET);
        assert_eq!(r.path, format!("{BASE}/blockaffinities"));
        assert_eq!(
            query_param(&r.query, "labelSelector"),
            Some(format!("{HOST_LABEL}={}", host_hash(host)))
        );
        assert_eq!(query_param(&r.query, "limit").as_deref(), Some("500"));
        respond(
            send,
            200,
            &json!({"apiVersion": "ipam.weir.dev/v1", "kind": "BlockAffinityList",
                    "metadata": {"resourceVersion": "9", "continue": "page2"},
                    "items": [object("BlockAffinity", &object_name(&m), &m, 7, json!({"host": "node-1"}))]}),
        );
        let (r, send) = next(&mut h).await;
        assert_eq!(query_param(&r.query, "continue").as_deref(), Some("page2"));
        assert!(
            query_param(&r.query, "labelSelector").is_some(),
            "the selector stays on every page"
        );
        let mut finalizing = object("BlockAffinity", "gone", "node-1/10.0.2.0-26", 8, json!({}));
        finalizing["metadata"]["deletionTimestamp"] = json!("2026-11-29T00:00:00Z");
        respond(
            send,
            200,
            &json!({"apiVersion": "ipam.weir.dev/v1", "kind": "BlockAffinityList",
                    "metadata": {"resourceVersion": "9"},
                    "items": [object("BlockAffinity", &object_name(&o), &o, 8, json!({"host": "node-10"})), finalizing]}),
        );
    });
    let rows = s
        .list(Kind::Affinity, &format!("{host}/"))
        .await
        .expect("list");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].0, mine);
    assert_eq!(rows[0].1.revision, Revision(7));
    server.await.expect("server");
}

#[tokio::test]
async fn create_replace_and_delete_carry_the_compare_and_swap_conditions() {
    let (s, mut h) = store();
    let server = tokio::spawn(async move {
        // create → 201
        let (r, send) = next(&mut h).await;
        assert_eq!(r.method, Method::POST);
        assert_eq!(r.path, format!("{BASE}/ipamhandles"));
        assert_eq!(r.body["metadata"]["name"], "net.c1");
        assert!(
            r.body["metadata"].get("resourceVersion").is_none(),
            "a create carries no resourceVersion"
        );
        assert_eq!(r.body["spec"], json!({"id": "net.c1", "blocks": {}}));
        let mut created = r.body.clone();
        created["metadata"]["resourceVersion"] = json!("100");
        respond(send, 201, &created);
        // create again → 409 AlreadyExists
        let (r, send) = next(&mut h).await;
        assert_eq!(r.method, Method::POST);
        respond(
            send,
            409,
            &status(
                409,
                "AlreadyExists",
                "ipamhandles.ipam.weir.dev \"net.c1\" already exists",
            ),
        );
        // replace with the read resourceVersion → 200
        let (r, send) = next(&mut h).await;
        assert_eq!(r.method, Method::PUT);
        assert_eq!(r.path, format!("{BASE}/ipamhandles/net.c1"));
        assert_eq!(r.body["metadata"]["resourceVersion"], "100");
        let mut replaced = r.body.clone();
        replaced["metadata"]["resourceVersion"] = json!("101");
        respond(send, 200, &replaced);
        // replace with a stale one → 409 Conflict
        let (r, send) = next(&mut h).await;
        assert_eq!(r.body["metadata"]["resourceVersion"], "100");
        respond(
            send,
            409,
            &status(
                409,
                "Conflict",
                "Operation cannot be fulfilled on ipamhandles.ipam.weir.dev \"net.c1\": the object has been modified; please apply your changes to the latest version and try again",
            ),
        );
        // delete with a resourceVersion precondition: stale → 409, then current → 200
        let (r, send) = next(&mut h).await;
        assert_eq!(r.method, Method::DELETE);
        assert_eq!(r.path, format!("{BASE}/ipamhandles/net.c1"));
        assert_eq!(r.body["preconditions"]["resourceVersion"], "100");
        respond(
            send,
            409,
            &status(
                409,
                "Conflict",
                "Precondition failed: ResourceVersion in precondition: 100, ResourceVersion in object meta: 101",
            ),
        );
        let (r, send) = next(&mut h).await;
        assert_eq!(r.body["preconditions"]["resourceVersion"], "101");
        respond(
            send,
            200,
            &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 200}),
        );
        // delete of an object that is gone → 404
        let (_, send) = next(&mut h).await;
        respond(
            send,
            404,
            &status(
                404,
                "NotFound",
                "ipamhandles.ipam.weir.dev \"net.c1\" not found",
            ),
        );
        // an error that is no conflict → 403
        let (_, send) = next(&mut h).await;
        respond(
            send,
            403,
            &status(
                403,
                "Forbidden",
                "ipamhandles.ipam.weir.dev is forbidden: User \"x\" cannot create resource",
            ),
        );
    });
    let key = Key::new(Kind::Handle, "net.c1");
    let value = br#"{"id":"net.c1","blocks":{}}"#.to_vec();
    let create = || Op::Create {
        key: key.clone(),
        value: value.clone(),
    };
    s.txn(vec![create()]).await.expect("create");
    let e = s.txn(vec![create()]).await.expect_err("exists");
    assert!(e.is_conflict(), "{e}");
    let update = || Op::Update {
        key: key.clone(),
        value: value.clone(),
        revision: Revision(100),
    };
    s.txn(vec![update()]).await.expect("replace");
    let e = s.txn(vec![update()]).await.expect_err("stale");
    assert!(e.is_conflict(), "{e}");
    let delete = |r| Op::Delete {
        key: key.clone(),
        revision: Revision(r),
    };
    let e = s.txn(vec![delete(100)]).await.expect_err("stale delete");
    assert!(e.is_conflict(), "{e}");
    s.txn(vec![delete(101)]).await.expect("delete");
    let e = s.txn(vec![delete(101)]).await.expect_err("gone");
    assert!(e.is_conflict(), "{e}");
    let e = s.txn(vec![create()]).await.expect_err("forbidden");
    assert!(
        matches!(
            e,
            StoreError::Unavailable {
                backend: "kubernetes",
                ..
            }
        ),
        "{e}"
    );
    server.await.expect("server");
}

#[tokio::test]
async fn read_modify_write_retries_a_409_with_a_fresh_read() {
    let (s, mut h) = store();
    let server = tokio::spawn(async move {
        let spec = |n: u64| json!({"strictAffinity": false, "autoAllocateBlocks": true, "maxBlocksPerHost": n, "ipCooldownSeconds": 0});
        let (r, send) = next(&mut h).await;
        assert_eq!(
            (r.method, r.path.as_str()),
            (Method::GET, format!("{BASE}/ipamconfigs/default").as_str())
        );
        respond(
            send,
            200,
            &object("IPAMConfig", "default", "default", 5, spec(1)),
        );
        let (r, send) = next(&mut h).await;
        assert_eq!(r.method, Method::PUT);
        assert_eq!(r.body["metadata"]["resourceVersion"], "5");
        assert_eq!(r.body["spec"]["maxBlocksPerHost"], 2);
        respond(
            send,
            409,
            &status(409, "Conflict", "the object has been modified"),
        );
        // fresh read: someone else set it to 7
        let (r, send) = next(&mut h).await;
        assert_eq!(r.method, Method::GET);
        respond(
            send,
            200,
            &object("IPAMConfig", "default", "default", 6, spec(7)),
        );
        let (r, send) = next(&mut h).await;
        assert_eq!(r.method, Method::PUT);
        assert_eq!(r.body["metadata"]["resourceVersion"], "6");
        assert_eq!(
            r.body["spec"]["maxBlocksPerHost"], 8,
            "decided on the fresh value"
        );
        let mut ok = r.body.clone();
        ok["metadata"]["resourceVersion"] = json!("7");
        respond(send, 200, &ok);
    });
    let out = s
        .read_modify_write(vec![Key::new(Kind::Config, "default")], |cur| {
            let mut v: Value =
                serde_json::from_slice(cur[0].as_deref().expect("present")).expect("json");
            let n = v["maxBlocksPerHost"].as_u64().expect("number") + 1;
            v["maxBlocksPerHost"] = json!(n);
            (vec![Write::Put(serde_json::to_vec(&v).expect("json"))], n)
        })
        .await
        .expect("read-modify-write");
    assert_eq!(out, 8);
    server.await.expect("server");
}

#[tokio::test]
async fn an_unreachable_api_server_is_reported_not_a_conflict() {
    let (s, mut h) = store();
    let server = tokio::spawn(async move {
        let (_, send) = next(&mut h).await;
        send.send_error(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connection refused",
        ));
    });
    let e = s
        .get(&Key::new(Kind::Pool, "p"))
        .await
        .expect_err("refused");
    assert!(
        matches!(
            e,
            StoreError::Unavailable {
                backend: "kubernetes",
                ..
            }
        ),
        "{e}"
    );
    assert!(!e.is_conflict());
    server.await.expect("server");
}

// ---------------------------------------------------------------------------------------------------------------
// A fake API server that follows the conventions, for whole allocations.

#[derive(Default)]
struct Cluster {
    objects: BTreeMap<(String, String), Value>,
    rv: u64,
    log: Vec<String>,
    /// Before serving a request whose log line starts with the string, another writer writes that object.
    interfere: VecDeque<String>,
}

fn kind_of(plural: &str) -> &'static str {
    match plural {
        "ippools" => "IPPool",
        "ipamconfigs" => "IPAMConfig",
        "ipreservations" => "IPReservation",
        "ipamblocks" => "IPAMBlock",
        "blockaffinities" => "BlockAffinity",
        "ipamhandles" => "IPAMHandle",
        "securityidentities" => "SecurityIdentity",
        "securityidentitykeys" => "SecurityIdentityKey",
        "weirnodes" => "WeirNode",
        "weirendpoints" => "WeirEndpoint",
        other => panic!("unexpected resource {other}"),
    }
}

impl Cluster {
    fn serve(&mut self, r: &Seen) -> (u16, Value) {
        let rest = r
            .path
            .strip_prefix(BASE)
            .expect("group path")
            .trim_start_matches('/');
        let (plural, name) = match rest.split_once('/') {
            Some((p, n)) => (p.to_owned(), Some(n.to_owned())),
            None => (rest.to_owned(), None),
        };
        let line = match &name {
            Some(n) => format!("{} {plural}/{n}", r.method),
            None if r.method == Method::GET => match query_param(&r.query, "labelSelector") {
                Some(sel) => format!("LIST {plural}?{sel}"),
                None => format!("LIST {plural}"),
            },
            None => format!("{} {plural}", r.method),
        };
        self.log.push(line.clone());
        if self
            .interfere
            .front()
            .is_some_and(|p| line.starts_with(p.as_str()))
        {
            self.interfere.pop_front();
            if let Some(n) = &name
                && let Some(obj) = self.objects.get_mut(&(plural.clone(), n.clone()))
            {
                self.rv += 1;
                obj["metadata"]["resourceVersion"] = json!(self.rv.to_string());
            }
        }
        let not_found = |n: &str| {
            (
                404,
                status(
                    404,
                    "NotFound",
                    &format!("{plural}.ipam.weir.dev \"{n}\" not found"),
                ),
            )
        };
        let conflict = |n: &str| {
            (
                409,
                status(
                    409,
                    "Conflict",
                    &format!(
                        "Operation cannot be fulfilled on {plural}.ipam.weir.dev \"{n}\": the object has been modified; please apply your changes to the latest version and try again"
                    ),
                ),
            )
        };
        match (r.method.clone(), name) {
            (Method::GET, Some(n)) => match self.objects.get(&(plural.clone(), n.clone())) {
                Some(o) => (200, o.clone()),
                None => not_found(&n),
            },
            (Method::GET, None) => {
                let sel = query_param(&r.query, "labelSelector");
                let items: Vec<Value> = self
                    .objects
                    .iter()
                    .filter(|((p, _), _)| *p == plural)
                    .map(|(_, o)| o.clone())
                    .filter(|o| match &sel {
                        None => true,
                        Some(s) => {
                            let (k, v) = s.split_once('=').expect("equality selector");
                            o["metadata"]["labels"][k] == json!(v)
                        }
                    })
                    .collect();
                (
                    200,
                    json!({"apiVersion": "ipam.weir.dev/v1", "kind": format!("{}List", kind_of(&plural)),
                             "metadata": {"resourceVersion": self.rv.to_string()}, "items": items}),
                )
            }
            (Method::POST, None) => {
                let n = r.body["metadata"]["name"]
                    .as_str()
                    .expect("name")
                    .to_owned();
                if self.objects.contains_key(&(plural.clone(), n.clone())) {
                    return (
                        409,
                        status(
                            409,
                            "AlreadyExists",
                            &format!("{plural}.ipam.weir.dev \"{n}\" already exists"),
                        ),
                    );
                }
                self.rv += 1;
                let mut o = r.body.clone();
                o["metadata"]["resourceVersion"] = json!(self.rv.to_string());
                self.objects.insert((plural, n), o.clone());
                (201, o)
            }
            (Method::PUT, Some(n)) => {
                let Some(cur) = self.objects.get(&(plural.clone(), n.clone())) else {
                    return not_found(&n);
                };
                if cur["metadata"]["resourceVersion"] != r.body["metadata"]["resourceVersion"] {
                    return conflict(&n);
                }
                self.rv += 1;
                let mut o = r.body.clone();
                o["metadata"]["resourceVersion"] = json!(self.rv.to_string());
                self.objects.insert((plural, n), o.clone());
                (200, o)
            }
            (Method::DELETE, Some(n)) => {
                let Some(cur) = self.objects.get(&(plural.clone(), n.clone())) else {
                    return not_found(&n);
                };
                let want = &r.body["preconditions"]["resourceVersion"];
                if !want.is_null() && *want != cur["metadata"]["resourceVersion"] {
                    return conflict(&n);
                }
                let o = self.objects.remove(&(plural, n)).expect("present");
                (200, o)
            }
            (m, n) => panic!("unexpected request {m} {n:?}"),
        }
    }
}

fn fake_cluster() -> (KubeStore, Arc<Mutex<Cluster>>) {
    let (s, mut h) = store();
    let cluster = Arc::new(Mutex::new(Cluster::default()));
    let c = Arc::clone(&cluster);
    tokio::spawn(async move {
        loop {
            let Some((req, send)) = h.next_request().await else {
                return;
            };
            let method = req.method().clone();
            let path = req.uri().path().to_owned();
            let query = req.uri().query().unwrap_or("").to_owned();
            let bytes = req.into_body().collect_bytes().await.expect("request body");
            let body = if bytes.is_empty() {
                Value::Null
            } else {
                serde_json::from_slice(&bytes).expect("json")
            };
            let seen = Seen {
                method,
                path,
                query,
                body,
            };
            assert_rbac_covers(&seen);
            let (code, resp) = c.lock().expect("cluster").serve(&seen);
            respond(send, code, &resp);
        }
    });
    (s, cluster)
}

fn take_log(c: &Arc<Mutex<Cluster>>) -> Vec<String> {
    std::mem::take(&mut c.lock().expect("cluster").log)
}

async fn ipam_with_pool() -> (Ipam<KubeStore>, Arc<Mutex<Cluster>>) {
    let (s, cluster) = fake_cluster();
    let ipam = Ipam::new(s);
    ipam.add_pool(IpPool {
        name: "pool-a".into(),
        cidr: "10.0.0.0/24".parse().expect("cidr"),
        block_size: 26,
        node_selector: String::new(),
        namespace_selector: String::new(),
        allowed_uses: vec![IpUse::Workload],
        disabled: false,
    })
    .await
    .expect("pool");
    take_log(&cluster);
    (ipam, cluster)
}

#[tokio::test]
async fn an_allocation_on_an_owned_block_is_reads_plus_two_compare_and_swap_writes_block_first() {
    let (ipam, cluster) = ipam_with_pool().await;
    let first = ipam
        .auto_assign(&AssignArgs::new("node-1", "net.c1", 1, 0))
        .await
        .expect("first allocation claims a block");
    assert_eq!(first.ipv4.len(), 1, "{first:?}");
    take_log(&cluster);

    let second = ipam
        .auto_assign(&AssignArgs::new("node-1", "net.c2", 1, 0))
        .await
        .expect("second allocation");
    assert_eq!(second.ipv4.len(), 1);
    assert_ne!(second.ipv4[0].ip(), first.ipv4[0].ip());
    let log = take_log(&cluster);
    let bname = ipam::cidr::cidr_name(&first.ipv4[0]);
    let block = object_name(&bname);
    let aff = object_name(&format!("node-1/{bname}"));
    let hash = host_hash("node-1");
    assert_eq!(
        log,
        [
            "GET ipamconfigs/default".to_owned(),
            "LIST ippools".to_owned(),
            "LIST ipreservations".to_owned(),
            // The host's block from its hint (the first allocation claimed it): no affinity listing.
            format!("GET ipamblocks/{block}"),
            "GET ipamhandles/net.c2".to_owned(),
            format!("PUT ipamblocks/{block}"),
            "POST ipamhandles".to_owned(),
        ],
        "one allocation on an owned block"
    );
    let writes: Vec<&String> = log
        .iter()
        .filter(|l| !l.starts_with("GET") && !l.starts_with("LIST"))
        .collect();
    assert_eq!(
        writes,
        [
            &format!("PUT ipamblocks/{block}"),
            &"POST ipamhandles".to_owned()
        ],
        "the hot path is two writes, block first, then handle: {log:#?}"
    );
    assert!(
        !log.contains(&format!("LIST blockaffinities?{HOST_LABEL}={hash}")),
        "the block came from the host's hint, not a listing: {log:#?}"
    );
    assert!(
        !log.iter()
            .any(|l| l == "LIST ipamblocks" || l == "LIST blockaffinities"),
        "no listing of every block or affinity on the hot path: {log:#?}"
    );
    assert!(log.contains(&format!("GET ipamblocks/{block}")), "{log:#?}");
    assert!(
        !log.iter()
            .any(|l| l.contains(&aff) && !l.starts_with("GET")),
        "{log:#?}"
    );

    // Labels and annotations on what was written.
    let c = cluster.lock().expect("cluster");
    let b = &c.objects[&("ipamblocks".to_owned(), block.clone())];
    assert_eq!(b["metadata"]["labels"][HOST_LABEL], json!(hash));
    let a = &c.objects[&("blockaffinities".to_owned(), aff)];
    assert_eq!(a["metadata"]["labels"][HOST_LABEL], json!(hash));
    assert_eq!(
        a["metadata"]["annotations"][NAME_ANNOTATION],
        json!(format!("node-1/{bname}"))
    );
    assert_eq!(a["spec"]["state"], "confirmed");
}

#[tokio::test]
async fn a_lost_block_race_is_retried_and_a_lost_handle_race_rolls_forward() {
    let (ipam, cluster) = ipam_with_pool().await;
    let first = ipam
        .auto_assign(&AssignArgs::new("node-1", "net.c1", 1, 0))
        .await
        .expect("claim");
    let block = object_name(&ipam::cidr::cidr_name(&first.ipv4[0]));
    take_log(&cluster);

    // Another writer changes the block between our read and our write: 409, fresh read, write again.
    cluster
        .lock()
        .expect("cluster")
        .interfere
        .push_back(format!("PUT ipamblocks/{block}"));
    let r = ipam
        .auto_assign(&AssignArgs::new("node-1", "net.c2", 1, 0))
        .await
        .expect("allocation after a conflict");
    assert_eq!(r.ipv4.len(), 1);
    let log = take_log(&cluster);
    let puts = log
        .iter()
        .filter(|l| **l == format!("PUT ipamblocks/{block}"))
        .count();
    assert_eq!(
        puts, 2,
        "the first PUT got 409 and was retried after a fresh GET: {log:#?}"
    );

    // Another writer changes the handle after our block write won: the handle write is redone on a fresh read
    // of the handle only; the block is not written again and no second address is taken.
    ipam.auto_assign(&AssignArgs::new("node-1", "net.shared", 1, 0))
        .await
        .expect("first address of the shared handle");
    let hname = "net.shared";
    take_log(&cluster);
    cluster
        .lock()
        .expect("cluster")
        .interfere
        .push_back(format!("PUT ipamhandles/{hname}"));
    let r = ipam
        .auto_assign(&AssignArgs::new("node-1", hname, 1, 0))
        .await
        .expect("allocation after a handle conflict");
    assert_eq!(r.ipv4.len(), 1);
    let log = take_log(&cluster);
    let block_puts = log
        .iter()
        .filter(|l| **l == format!("PUT ipamblocks/{block}"))
        .count();
    let handle_puts = log
        .iter()
        .filter(|l| **l == format!("PUT ipamhandles/{hname}"))
        .count();
    assert_eq!((block_puts, handle_puts), (1, 2), "{log:#?}");

    let report = ipam.check().await.expect("check");
    assert!(report.ok(), "{report:?}");
    assert_eq!(report.allocations, 4);
    let ips = ipam.ips_by_handle(hname).await.expect("ips by handle");
    assert_eq!(ips.len(), 2, "{ips:?}");
}

#[tokio::test]
async fn a_crash_between_block_and_handle_is_found_by_check_and_repaired() {
    let (ipam, cluster) = ipam_with_pool().await;
    let first = ipam
        .auto_assign(&AssignArgs::new("node-1", "net.c1", 1, 0))
        .await
        .expect("claim");
    let bname = ipam::cidr::cidr_name(&first.ipv4[0]);
    // The crash: the handle write never happened.
    cluster
        .lock()
        .expect("cluster")
        .objects
        .remove(&("ipamhandles".to_owned(), "net.c1".to_owned()));
    let report = ipam.check().await.expect("check");
    assert!(!report.ok());
    assert!(
        report.problems.iter().any(|p| p.contains(&format!(
            "\"net.c1\" records 0 addresses in block {bname} but the block holds 1"
        ))),
        "{report:?}"
    );
    let fixed = ipam.repair_handles().await.expect("repair");
    assert_eq!(fixed, ["net.c1"]);
    assert!(ipam.check().await.expect("check").ok());
    let released = ipam
        .release_by_handle("net.c1")
        .await
        .expect("release by handle");
    assert_eq!(
        released.len(),
        1,
        "the repaired handle finds its address: {released:?}"
    );
    assert!(
        ipam.repair_handles().await.expect("repair").is_empty(),
        "nothing left to repair"
    );
}

#[tokio::test]
async fn identities_through_the_kubernetes_store_agree_between_nodes_and_are_collected() {
    let (s, cluster) = fake_cluster();
    let a = ipam::identity::IdentityAllocator::new(s.clone(), "node-a", 256..=65_535, 60);
    let b = ipam::identity::IdentityAllocator::new(s, "node-b", 256..=65_535, 60);
    let web = BTreeMap::from([("app".to_owned(), "web".to_owned())]);
    let db = BTreeMap::from([("app".to_owned(), "db".to_owned())]);
    let id = a.allocate(&web, 1_000).await.expect("a web");
    assert_eq!(
        b.allocate(&web, 1_000).await.expect("b web"),
        id,
        "one number per label set"
    );
    let other = b.allocate(&db, 1_000).await.expect("b db");
    assert_ne!(other, id);
    // Both objects are custom resources of the group, created with compare-and-swap.
    let log = take_log(&cluster);
    assert!(
        log.iter().any(|l| l.contains("securityidentities")),
        "{log:?}"
    );
    assert!(
        log.iter().any(|l| l.contains("securityidentitykeys")),
        "{log:?}"
    );
    a.release(id, 1_010).await.expect("a lets go");
    assert!(
        b.renew(&[id, other], 1_090)
            .await
            .expect("b renews")
            .is_empty()
    );
    assert!(
        a.collect_garbage(1_100).await.expect("gc").is_empty(),
        "b still renews web"
    );
    b.release(id, 1_120).await.expect("b lets go");
    assert!(
        a.collect_garbage(1_140).await.expect("gc").is_empty(),
        "within the grace period"
    );
    assert_eq!(a.collect_garbage(1_200).await.expect("gc"), vec![id, other]);
    assert!(a.list().await.expect("list").is_empty());
}
