//! One suite, both backends: every case in `cases` runs against the embedded store, against
//! a real etcd started for the test (switchyard-test-support's `etcd`), and against an etcd with TLS
//! (client certificates required) and authentication on, reached as a non-root user. Cases
//! that only make sense for one backend (restart, directory lock, retention, TLS and auth
//! errors, token expiry) are at the end.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use switchyard_control_plane::store::embedded::{EmbeddedStore, Options};
use switchyard_control_plane::store::etcd::{EtcdCredentials, EtcdOptions, EtcdStore, EtcdTls};
use switchyard_control_plane::store::{
    Compare, CompareOp, CompareTarget, EventKind, Store, StoreError, Txn, TxnOp, WatchBatch,
    WatchEvent, WatchStream, election,
};
use switchyard_test_support::etcd as etcd_process;
use switchyard_test_support::{pki, port};

/// A backend under test plus whatever must outlive it (its directory or its etcd process).
pub struct Backend {
    store: Arc<dyn Store>,
    _guard: Guard,
}

enum Guard {
    Dir(#[allow(dead_code)] tempfile::TempDir),
    Etcd(#[allow(dead_code)] Box<etcd_process::EtcdProcess>),
    Secure(#[allow(dead_code)] Box<SecureEtcd>),
}

/// A one-member etcd with TLS on its client and peer URLs, client certificates required,
/// and authentication on; `user` may read and write `prefix`.
pub struct SecureEtcd {
    cluster: etcd_process::EtcdCluster,
    ca: pki::Ca,
    client: pki::Leaf,
    setup: etcd_process::AuthSetup,
}

impl SecureEtcd {
    async fn start(prefix: &str, auth_token_ttl: Option<Duration>) -> Self {
        let ca = pki::Ca::new("etcd test CA");
        let server = ca.leaf("etcd-member", &["localhost", "127.0.0.1"]);
        // Its common name is no etcd user: a call is authorised by its token, not by the
        // certificate (etcd takes the CN as the user when a call has no token).
        let client = ca.leaf("switchyard-client", &["localhost"]);
        let tls = etcd_process::TlsFiles {
            ca: ca.cert_path().to_owned(),
            cert: server.cert.clone(),
            key: server.key.clone(),
        };
        let options = etcd_process::ClusterOptions {
            members: 1,
            tls: Some(tls),
            auth_token_ttl,
            heartbeat_ms: 10,
            election_ms: 100,
        };
        let mut cluster = etcd_process::EtcdCluster::start(options).await;
        let setup = etcd_process::AuthSetup {
            root_password: "root-secret-password".into(),
            user: "switchyard".into(),
            password: "switchyard-secret-password".into(),
            prefix: prefix.into(),
        };
        cluster.enable_auth(&setup).await;
        Self { cluster, ca, client, setup }
    }

    fn options(&self, key_scope: &str) -> EtcdOptions {
        EtcdOptions {
            tls: Some(EtcdTls {
                ca: self.ca.cert_path().to_owned(),
                identity: Some((self.client.cert.clone(), self.client.key.clone())),
            }),
            credentials: Some(EtcdCredentials {
                user: self.setup.user.clone(),
                password: self.setup.password.clone(),
            }),
            key_scope: key_scope.into(),
        }
    }

    async fn connect(&self, key_scope: &str) -> Result<EtcdStore, StoreError> {
        EtcdStore::connect_with(&self.cluster.endpoints(), self.options(key_scope)).await
    }
}

impl Backend {
    async fn embedded() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path()).await.unwrap();
        Self { store: Arc::new(store), _guard: Guard::Dir(dir) }
    }

    async fn etcd() -> Self {
        let etcd = etcd_process::EtcdProcess::start().await;
        let store = EtcdStore::connect(&[etcd.endpoint().to_owned()]).await.unwrap();
        Self { store: Arc::new(store), _guard: Guard::Etcd(Box::new(etcd)) }
    }

    /// The cases write keys anywhere, so the user's role covers every key here; the
    /// prefix-limited user is exercised in `etcd_only` and the end-to-end cluster test.
    async fn etcd_tls_auth() -> Self {
        let etcd = SecureEtcd::start("", None).await;
        let store = etcd.connect("").await.unwrap();
        Self { store: Arc::new(store), _guard: Guard::Secure(Box::new(etcd)) }
    }
}

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::cases::$name(super::Backend::embedded().await).await;
                }
            )*
        }
        mod etcd {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::cases::$name(super::Backend::etcd().await).await;
                }
            )*
        }
        mod etcd_tls_auth {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::cases::$name(super::Backend::etcd_tls_auth().await).await;
                }
            )*
        }
    };
}

conformance!(
    get_put_delete_round_trip,
    versions_and_revisions_are_tracked_per_key,
    revision_starts_at_one_and_grows_by_one_per_changing_write,
    list_is_sorted_and_respects_prefix_boundaries,
    a_listing_larger_than_one_response_comes_back_whole,
    a_listing_of_thousands_of_small_keys_then_large_values_comes_back_whole,
    list_keys_pages_through_a_prefix_and_counts_it,
    list_page_pages_through_a_prefix_with_values,
    list_page_of_values_larger_than_one_response_comes_in_smaller_pages,
    txn_absent_compare_runs_success_then_failure_branch,
    txn_mod_revision_compare_is_compare_and_swap,
    txn_value_compare_and_missing_key_never_matches_a_value,
    txn_not_equal_greater_less_compares,
    txn_writing_one_key_twice_is_rejected,
    txn_with_more_than_128_ops_per_branch_is_rejected,
    txn_delete_range_removes_the_half_open_range_at_one_revision,
    txn_delete_range_with_its_end_not_past_its_start_is_rejected,
    compact_to_a_future_revision_is_rejected,
    watch_from_past_revision_replays_history_in_order,
    live_watch_sees_only_later_writes_under_its_prefix,
    delete_event_carries_key_and_delete_revision,
    events_of_one_txn_arrive_in_one_batch,
    watch_from_compacted_revision_yields_compacted_with_the_floor,
    lease_expiry_deletes_keys_and_emits_delete_events,
    revoke_deletes_attached_keys_at_one_new_revision,
    keep_alive_keeps_keys_past_their_ttl,
    keep_alive_of_expired_lease_is_lease_not_found,
    put_with_unknown_lease_is_lease_not_found,
    election_has_one_leader_and_hands_over_on_resign,
    election_hands_over_when_the_leaders_lease_is_revoked,
    campaign_fails_when_the_waiting_candidates_lease_is_revoked,
);

const WAIT: Duration = Duration::from_secs(10);
/// Etcd's minimum with the harness's raft timings; the embedded store honours it as is.
const SHORT_TTL: Duration = Duration::from_secs(1);

async fn next_batch(watch: &mut WatchStream) -> WatchBatch {
    match tokio::time::timeout(WAIT, watch.next()).await {
        Ok(Some(Ok(batch))) => batch,
        Ok(Some(Err(e))) => panic!("watch failed: {e}"),
        Ok(None) => panic!("watch ended"),
        Err(_) => panic!("no watch batch within {WAIT:?}"),
    }
}

/// The next `n` events, whatever batches they came in.
async fn next_events(watch: &mut WatchStream, n: usize) -> Vec<WatchEvent> {
    let mut events = Vec::new();
    while events.len() < n {
        events.extend(next_batch(watch).await.events);
    }
    assert_eq!(events.len(), n, "more events than expected: {events:?}");
    events
}

async fn eventually<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = Instant::now();
    while !condition().await {
        assert!(started.elapsed() < WAIT, "timed out waiting until {what}");
        // The polling interval: the stores under test (etcd, or the embedded store's writer
        // thread) run on the wall clock, so a paused tokio clock could not hurry them.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn put(key: &str, value: &str) -> TxnOp {
    TxnOp::Put { key: key.into(), value: value.as_bytes().to_vec(), lease: None }
}

fn cmp(key: &str, op: CompareOp, target: CompareTarget) -> Compare {
    Compare { key: key.into(), op, target }
}

mod cases {
    use super::*;

    pub async fn get_put_delete_round_trip(b: Backend) {
        let s = &b.store;
        assert_eq!(s.get("k").await.unwrap(), None);
        s.put("k", b"v1".to_vec(), None).await.unwrap();
        let kv = s.get("k").await.unwrap().unwrap();
        assert_eq!((kv.key.as_str(), &kv.value[..], kv.lease), ("k", &b"v1"[..], 0));
        assert!(s.delete("k").await.unwrap(), "delete of an existing key reports it existed");
        assert_eq!(s.get("k").await.unwrap(), None);
        assert!(!s.delete("k").await.unwrap(), "delete of a missing key reports it did not");
    }

    pub async fn versions_and_revisions_are_tracked_per_key(b: Backend) {
        let s = &b.store;
        let r1 = s.put("k", b"1".to_vec(), None).await.unwrap();
        let kv = s.get("k").await.unwrap().unwrap();
        assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (r1, r1, 1));
        let r2 = s.put("k", b"2".to_vec(), None).await.unwrap();
        assert_eq!(r2, r1 + 1);
        let kv = s.get("k").await.unwrap().unwrap();
        assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (r1, r2, 2));
        s.put("other", b"x".to_vec(), None).await.unwrap();
        assert_eq!(s.get("k").await.unwrap().unwrap().mod_revision, r2, "other keys don't touch k");
        s.delete("k").await.unwrap();
        let r4 = s.put("k", b"3".to_vec(), None).await.unwrap();
        let kv = s.get("k").await.unwrap().unwrap();
        assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (r4, r4, 1), "recreated");
    }

    pub async fn revision_starts_at_one_and_grows_by_one_per_changing_write(b: Backend) {
        let s = &b.store;
        assert_eq!(s.current_revision().await.unwrap(), 1);
        assert_eq!(s.put("a", b"1".to_vec(), None).await.unwrap(), 2);
        let txn = Txn { success: vec![put("b", "1"), put("c", "1")], ..Txn::default() };
        assert_eq!(s.txn(txn).await.unwrap().revision, 3, "one txn is one revision");
        assert!(!s.delete("missing").await.unwrap());
        assert_eq!(s.current_revision().await.unwrap(), 3, "a delete that deletes nothing");
        let failing = Txn { compare: vec![Compare::absent("a")], ..Txn::default() };
        let result = s.txn(failing).await.unwrap();
        assert!(!result.succeeded);
        assert_eq!(result.revision, 3, "a txn that changes nothing");
        assert!(s.delete("a").await.unwrap());
        assert_eq!(s.current_revision().await.unwrap(), 4);
    }

    pub async fn list_is_sorted_and_respects_prefix_boundaries(b: Backend) {
        let s = &b.store;
        for key in ["a/2", "a0", "a/1", "a", "b/1", "a/1/x", "a/"] {
            s.put(key, key.as_bytes().to_vec(), None).await.unwrap();
        }
        let listing = s.list("a/").await.unwrap();
        let keys: Vec<&str> = listing.kvs.iter().map(|kv| kv.key.as_str()).collect();
        assert_eq!(keys, ["a/", "a/1", "a/1/x", "a/2"]);
        assert_eq!(listing.revision, s.current_revision().await.unwrap());
        assert!(s.list("zzz/").await.unwrap().kvs.is_empty());
        assert_eq!(s.list("").await.unwrap().kvs.len(), 7, "the empty prefix lists every key");
    }

    /// Values of 1 MiB (the audit log's batches are up to that): 20 of them are more than
    /// the etcd client decodes in one response, so the listing must come in smaller pages.
    pub async fn a_listing_larger_than_one_response_comes_back_whole(b: Backend) {
        let s = &b.store;
        for i in 0..20u8 {
            s.put(&format!("big/{i:02}"), vec![i; 1024 * 1024], None).await.unwrap();
        }
        let listing = s.list("big/").await.unwrap();
        assert_eq!(listing.kvs.len(), 20);
        for (i, kv) in listing.kvs.iter().enumerate() {
            assert_eq!(kv.key, format!("big/{i:02}"));
            assert_eq!(kv.value.len(), 1024 * 1024);
            assert!(kv.value.iter().all(|b| usize::from(*b) == i));
        }
    }

    /// Thousands of small keys (a fleet's API keys), then values of 1 MiB: on etcd the pages
    /// grow past the first (small keys) and shrink again (the large values), and the
    /// listing is still every key once, in order.
    pub async fn a_listing_of_thousands_of_small_keys_then_large_values_comes_back_whole(
        b: Backend,
    ) {
        let s = &b.store;
        let small = 3_000;
        let mut ops = Vec::new();
        for i in 0..small {
            ops.push(TxnOp::Put {
                key: format!("mix/a{i:05}"),
                value: vec![b'k'; 16],
                lease: None,
            });
            if ops.len() == 128 || i + 1 == small {
                let txn =
                    Txn { compare: vec![], success: std::mem::take(&mut ops), failure: vec![] };
                s.txn(txn).await.unwrap();
            }
        }
        for i in 0..20u8 {
            s.put(&format!("mix/z{i:02}"), vec![i; 1024 * 1024], None).await.unwrap();
        }
        let listing = s.list("mix/").await.unwrap();
        assert_eq!(listing.kvs.len(), small + 20);
        for (i, kv) in listing.kvs.iter().take(small).enumerate() {
            assert_eq!(kv.key, format!("mix/a{i:05}"));
        }
        for (i, kv) in listing.kvs.iter().skip(small).enumerate() {
            assert_eq!(kv.key, format!("mix/z{i:02}"));
            assert!(kv.value.len() == 1024 * 1024 && kv.value.iter().all(|b| usize::from(*b) == i));
        }
    }

    pub async fn list_keys_pages_through_a_prefix_and_counts_it(b: Backend) {
        let s = &b.store;
        for key in ["a/2", "a0", "a/1", "a", "b/1", "a/1/x", "a/"] {
            s.put(key, key.as_bytes().to_vec(), None).await.unwrap();
        }
        let first = s.list_keys("a/", "a/", 2).await.unwrap();
        assert_eq!(first.keys, ["a/", "a/1"]);
        assert_eq!(first.revision, s.current_revision().await.unwrap());
        let rest = s.list_keys("a/", "a/1\0", 10).await.unwrap();
        assert_eq!(rest.keys, ["a/1/x", "a/2"], "the next page starts at `from`");
        assert!(s.list_keys("a/", "a/", 0).await.unwrap().keys.is_empty(), "limit 0: no keys");
        assert_eq!(
            s.list_keys("a/", "", 10).await.unwrap().keys.len(),
            4,
            "never before the prefix"
        );
        assert!(s.list_keys("zzz/", "zzz/", 10).await.unwrap().keys.is_empty());
        assert_eq!(s.count("a/").await.unwrap(), (4, s.current_revision().await.unwrap()));
        assert_eq!(s.count("").await.unwrap().0, 7, "the empty prefix counts every key");
        assert_eq!(s.count("zzz/").await.unwrap().0, 0);
    }

    pub async fn list_page_pages_through_a_prefix_with_values(b: Backend) {
        let s = &b.store;
        for key in ["a/2", "a0", "a/1", "a", "b/1", "a/1/x", "a/"] {
            s.put(key, key.as_bytes().to_vec(), None).await.unwrap();
        }
        let first = s.list_page("a/", "a/", 2).await.unwrap();
        let keys: Vec<&str> = first.kvs.iter().map(|kv| kv.key.as_str()).collect();
        assert_eq!(keys, ["a/", "a/1"]);
        assert!(first.kvs.iter().all(|kv| kv.value == kv.key.as_bytes()), "values come along");
        assert_eq!(first.revision, s.current_revision().await.unwrap());
        let rest = s.list_page("a/", "a/1\0", 10).await.unwrap();
        let keys: Vec<&str> = rest.kvs.iter().map(|kv| kv.key.as_str()).collect();
        assert_eq!(keys, ["a/1/x", "a/2"], "the next page starts at `from`");
        assert!(s.list_page("a/", "a/", 0).await.unwrap().kvs.is_empty(), "limit 0: no keys");
        assert_eq!(
            s.list_page("a/", "", 10).await.unwrap().kvs.len(),
            4,
            "never before the prefix"
        );
        assert!(s.list_page("zzz/", "zzz/", 10).await.unwrap().kvs.is_empty());
    }

    /// 20 values of 1 MiB asked for in one page: more than etcd's client decodes at once,
    /// so a page may hold fewer, but paging on from the last key gets every one once.
    pub async fn list_page_of_values_larger_than_one_response_comes_in_smaller_pages(b: Backend) {
        let s = &b.store;
        for i in 0..20u8 {
            s.put(&format!("big/{i:02}"), vec![i; 1024 * 1024], None).await.unwrap();
        }
        let (mut keys, mut from) = (Vec::new(), "big/".to_owned());
        loop {
            let page = s.list_page("big/", &from, 20).await.unwrap();
            let Some(last) = page.kvs.last() else { break };
            from = format!("{}\0", last.key);
            for kv in &page.kvs {
                assert_eq!(kv.value.len(), 1024 * 1024);
                keys.push(kv.key.clone());
            }
        }
        let expected: Vec<String> = (0..20).map(|i| format!("big/{i:02}")).collect();
        assert_eq!(keys, expected);
    }

    pub async fn txn_absent_compare_runs_success_then_failure_branch(b: Backend) {
        let s = &b.store;
        let create = || Txn {
            compare: vec![Compare::absent("lock")],
            success: vec![put("lock", "me")],
            failure: vec![put("lost", "yes")],
        };
        let first = s.txn(create()).await.unwrap();
        assert!(first.succeeded);
        assert_eq!(&s.get("lock").await.unwrap().unwrap().value[..], b"me");
        assert_eq!(s.get("lost").await.unwrap(), None, "failure branch did not run");
        let second = s.txn(create()).await.unwrap();
        assert!(!second.succeeded);
        assert_eq!(second.revision, first.revision + 1, "the failure branch wrote");
        assert_eq!(&s.get("lost").await.unwrap().unwrap().value[..], b"yes");
    }

    pub async fn txn_mod_revision_compare_is_compare_and_swap(b: Backend) {
        let s = &b.store;
        let r = s.put("k", b"1".to_vec(), None).await.unwrap();
        let cas = |rev| Txn {
            compare: vec![Compare::mod_revision("k", rev)],
            success: vec![put("k", "2")],
            failure: vec![],
        };
        assert!(s.txn(cas(r)).await.unwrap().succeeded);
        assert!(!s.txn(cas(r)).await.unwrap().succeeded, "stale mod revision");
        assert_eq!(&s.get("k").await.unwrap().unwrap().value[..], b"2");
        assert!(
            s.txn(Txn { compare: vec![Compare::mod_revision("missing", 0)], ..Txn::default() })
                .await
                .unwrap()
                .succeeded
        );
    }

    pub async fn txn_value_compare_and_missing_key_never_matches_a_value(b: Backend) {
        let s = &b.store;
        s.put("k", b"v".to_vec(), None).await.unwrap();
        let check = |key: &str, op, value: &[u8]| Txn {
            compare: vec![cmp(key, op, CompareTarget::Value(value.to_vec()))],
            ..Txn::default()
        };
        assert!(s.txn(check("k", CompareOp::Equal, b"v")).await.unwrap().succeeded);
        assert!(!s.txn(check("k", CompareOp::Equal, b"w")).await.unwrap().succeeded);
        assert!(s.txn(check("k", CompareOp::NotEqual, b"w")).await.unwrap().succeeded);
        assert!(s.txn(check("k", CompareOp::Greater, b"a")).await.unwrap().succeeded);
        assert!(s.txn(check("k", CompareOp::Less, b"z")).await.unwrap().succeeded);
        for op in [CompareOp::Equal, CompareOp::NotEqual, CompareOp::Greater, CompareOp::Less] {
            assert!(
                !s.txn(check("missing", op, b"")).await.unwrap().succeeded,
                "{op:?} on a missing key's value"
            );
        }
    }

    pub async fn txn_not_equal_greater_less_compares(b: Backend) {
        let s = &b.store;
        let r1 = s.put("k", b"1".to_vec(), None).await.unwrap();
        s.put("k", b"2".to_vec(), None).await.unwrap();
        let holds = |c: Compare| {
            let s = s.clone();
            async move { s.txn(Txn { compare: vec![c], ..Txn::default() }).await.unwrap().succeeded }
        };
        assert!(holds(cmp("k", CompareOp::Greater, CompareTarget::Version(1))).await);
        assert!(!holds(cmp("k", CompareOp::Greater, CompareTarget::Version(2))).await);
        assert!(holds(cmp("k", CompareOp::Less, CompareTarget::Version(3))).await);
        assert!(holds(cmp("k", CompareOp::NotEqual, CompareTarget::Version(1))).await);
        assert!(holds(cmp("k", CompareOp::Equal, CompareTarget::CreateRevision(r1))).await);
        assert!(holds(cmp("k", CompareOp::Greater, CompareTarget::ModRevision(r1))).await);
        assert!(holds(cmp("k", CompareOp::Less, CompareTarget::CreateRevision(r1 + 1))).await);
        // A missing key counts as 0 for version and revisions.
        assert!(holds(cmp("missing", CompareOp::Equal, CompareTarget::Version(0))).await);
        assert!(holds(cmp("missing", CompareOp::Less, CompareTarget::ModRevision(1))).await);
        assert!(!holds(cmp("missing", CompareOp::Greater, CompareTarget::CreateRevision(0))).await);
        // Every comparison must hold.
        let mixed = Txn {
            compare: vec![
                cmp("k", CompareOp::Equal, CompareTarget::Version(2)),
                cmp("k", CompareOp::Equal, CompareTarget::Version(1)),
            ],
            ..Txn::default()
        };
        assert!(!s.txn(mixed).await.unwrap().succeeded);
    }

    pub async fn txn_writing_one_key_twice_is_rejected(b: Backend) {
        let s = &b.store;
        let before = s.current_revision().await.unwrap();
        let twice = Txn { success: vec![put("k", "1"), put("k", "2")], ..Txn::default() };
        let put_and_delete = Txn {
            success: vec![put("a/1", "1"), TxnOp::DeletePrefix { prefix: "a/".into() }],
            ..Txn::default()
        };
        // Both branches are checked, even the one that would not run.
        let in_failure = Txn {
            success: vec![put("x", "1")],
            failure: vec![TxnOp::Delete { key: "y".into() }, put("y", "1")],
            ..Txn::default()
        };
        let put_in_range = Txn {
            success: vec![
                put("r/5", "1"),
                TxnOp::DeleteRange { start: "r/1".into(), end: "r/9".into() },
            ],
            ..Txn::default()
        };
        for txn in [twice, put_and_delete, in_failure, put_in_range] {
            match s.txn(txn.clone()).await {
                Err(StoreError::InvalidRequest(_)) => {}
                other => panic!("expected InvalidRequest for {txn:?}, got {other:?}"),
            }
        }
        assert_eq!(s.current_revision().await.unwrap(), before, "nothing was written");
        let deletes_twice = Txn {
            success: vec![TxnOp::Delete { key: "k".into() }, TxnOp::Delete { key: "k".into() }],
            ..Txn::default()
        };
        assert!(s.txn(deletes_twice).await.unwrap().succeeded, "deleting twice is allowed");
    }

    pub async fn txn_delete_range_removes_the_half_open_range_at_one_revision(b: Backend) {
        let s = &b.store;
        for key in ["a/1", "a/2", "a/20", "a/3", "a/4", "b/2"] {
            s.put(key, b"v".to_vec(), None).await.unwrap();
        }
        let mut watch = s.watch("", 0).await.unwrap();
        let range = TxnOp::DeleteRange { start: "a/2".into(), end: "a/4".into() };
        let r = s.txn(Txn { success: vec![range], ..Txn::default() }).await.unwrap();
        assert!(r.succeeded);
        let left: Vec<String> =
            s.list("").await.unwrap().kvs.into_iter().map(|kv| kv.key).collect();
        assert_eq!(left, ["a/1", "a/4", "b/2"], "start included, end excluded");
        let batch = next_batch(&mut watch).await;
        let deleted: Vec<(&str, EventKind, i64)> =
            batch.events.iter().map(|e| (e.kv.key.as_str(), e.kind, e.kv.mod_revision)).collect();
        assert_eq!(
            deleted,
            [
                ("a/2", EventKind::Delete, r.revision),
                ("a/20", EventKind::Delete, r.revision),
                ("a/3", EventKind::Delete, r.revision),
            ],
            "one delete event per key, all at the transaction's revision"
        );
        let nothing = TxnOp::DeleteRange { start: "c/".into(), end: "d/".into() };
        let before = s.current_revision().await.unwrap();
        assert!(s.txn(Txn { success: vec![nothing], ..Txn::default() }).await.unwrap().succeeded);
        assert_eq!(s.current_revision().await.unwrap(), before, "an empty range changes nothing");
    }

    pub async fn txn_delete_range_with_its_end_not_past_its_start_is_rejected(b: Backend) {
        let s = &b.store;
        s.put("a/1", b"v".to_vec(), None).await.unwrap();
        let before = s.current_revision().await.unwrap();
        // etcd itself reads an end of "\0" as "every key from start on".
        for (start, end) in [("a/1", "a/1"), ("a/2", "a/1"), ("a/", "\0"), ("", "a")] {
            let txn = Txn {
                success: vec![TxnOp::DeleteRange { start: start.into(), end: end.into() }],
                ..Txn::default()
            };
            match s.txn(txn).await {
                Err(StoreError::InvalidRequest(m)) => assert!(m.contains("key range"), "{m}"),
                other => panic!("expected InvalidRequest for [{start}, {end}), got {other:?}"),
            }
        }
        assert_eq!(s.get("a/1").await.unwrap().map(|kv| kv.key), Some("a/1".to_owned()));
        assert_eq!(s.current_revision().await.unwrap(), before, "nothing was written");
    }

    pub async fn txn_with_more_than_128_ops_per_branch_is_rejected(b: Backend) {
        let s = &b.store;
        let puts = |n: usize| Txn {
            success: (0..n).map(|i| put(&format!("bulk/{i}"), "v")).collect(),
            ..Txn::default()
        };
        assert!(matches!(s.txn(puts(129)).await, Err(StoreError::InvalidRequest(_))));
        assert!(s.txn(puts(128)).await.unwrap().succeeded);
        assert_eq!(s.list("bulk/").await.unwrap().kvs.len(), 128);
    }

    pub async fn compact_to_a_future_revision_is_rejected(b: Backend) {
        let s = &b.store;
        let current = s.current_revision().await.unwrap();
        assert!(matches!(s.compact(current + 10).await, Err(StoreError::InvalidRequest(_))));
        s.compact(current).await.unwrap();
        s.compact(current).await.unwrap();
        assert!(s.compact(current - 1).await.is_ok(), "compacting below the floor is a no-op");
    }

    pub async fn watch_from_past_revision_replays_history_in_order(b: Backend) {
        let s = &b.store;
        let r1 = s.put("a/1", b"1".to_vec(), None).await.unwrap();
        let r2 = s.put("a/2", b"2".to_vec(), None).await.unwrap();
        s.put("b/1", b"x".to_vec(), None).await.unwrap();
        s.delete("a/1").await.unwrap();
        let r4 = s.current_revision().await.unwrap();
        let mut watch = s.watch("a/", r1).await.unwrap();
        let events = next_events(&mut watch, 3).await;
        let seen: Vec<(EventKind, &str, i64)> =
            events.iter().map(|e| (e.kind, e.kv.key.as_str(), e.kv.mod_revision)).collect();
        assert_eq!(
            seen,
            [
                (EventKind::Put, "a/1", r1),
                (EventKind::Put, "a/2", r2),
                (EventKind::Delete, "a/1", r4)
            ]
        );
        assert_eq!(&events[1].kv.value[..], b"2");
        // ...then live.
        let r5 = s.put("a/3", b"3".to_vec(), None).await.unwrap();
        let live = next_events(&mut watch, 1).await;
        assert_eq!((live[0].kv.key.as_str(), live[0].kv.mod_revision), ("a/3", r5));
    }

    pub async fn live_watch_sees_only_later_writes_under_its_prefix(b: Backend) {
        let s = &b.store;
        s.put("a/old", b"old".to_vec(), None).await.unwrap();
        let mut watch = s.watch("a/", 0).await.unwrap();
        s.put("a0", b"outside".to_vec(), None).await.unwrap();
        s.put("b/1", b"outside".to_vec(), None).await.unwrap();
        let r = s.put("a/new", b"new".to_vec(), None).await.unwrap();
        let events = next_events(&mut watch, 1).await;
        assert_eq!(events[0].kind, EventKind::Put);
        assert_eq!(
            (events[0].kv.key.as_str(), &events[0].kv.value[..], events[0].kv.mod_revision),
            ("a/new", &b"new"[..], r)
        );
        assert_eq!((events[0].kv.create_revision, events[0].kv.version), (r, 1));
    }

    pub async fn delete_event_carries_key_and_delete_revision(b: Backend) {
        let s = &b.store;
        s.put("a/k", b"v".to_vec(), None).await.unwrap();
        let mut watch = s.watch("a/", 0).await.unwrap();
        assert!(s.delete("a/k").await.unwrap());
        let deleted_at = s.current_revision().await.unwrap();
        let events = next_events(&mut watch, 1).await;
        assert_eq!(events[0].kind, EventKind::Delete);
        assert_eq!(events[0].kv.key, "a/k");
        assert_eq!(events[0].kv.mod_revision, deleted_at);
        assert!(events[0].kv.value.is_empty());
    }

    pub async fn events_of_one_txn_arrive_in_one_batch(b: Backend) {
        let s = &b.store;
        s.put("a/0", b"0".to_vec(), None).await.unwrap();
        let mut watch = s.watch("a/", 0).await.unwrap();
        let txn = Txn {
            success: vec![put("a/1", "1"), put("a/2", "2"), TxnOp::Delete { key: "a/0".into() }],
            ..Txn::default()
        };
        let r = s.txn(txn).await.unwrap().revision;
        let batch = next_batch(&mut watch).await;
        assert_eq!(batch.events.len(), 3, "{batch:?}");
        assert!(batch.events.iter().all(|e| e.kv.mod_revision == r));
        let kinds: Vec<EventKind> = batch.events.iter().map(|e| e.kind).collect();
        assert_eq!(kinds, [EventKind::Put, EventKind::Put, EventKind::Delete]);
    }

    pub async fn watch_from_compacted_revision_yields_compacted_with_the_floor(b: Backend) {
        let s = &b.store;
        let r1 = s.put("k", b"1".to_vec(), None).await.unwrap();
        s.put("k", b"2".to_vec(), None).await.unwrap();
        let r3 = s.put("k", b"3".to_vec(), None).await.unwrap();
        s.compact(r3).await.unwrap();
        let mut watch = s.watch("k", r1).await.unwrap();
        match tokio::time::timeout(WAIT, watch.next()).await.unwrap() {
            Some(Err(StoreError::Compacted { compact_revision })) => {
                assert_eq!(compact_revision, r3)
            }
            other => panic!("expected Compacted, got {other:?}"),
        }
        assert!(tokio::time::timeout(WAIT, watch.next()).await.unwrap().is_none(), "stream ends");
        // The floor itself is still watchable.
        let mut watch = s.watch("k", r3).await.unwrap();
        let events = next_events(&mut watch, 1).await;
        assert_eq!((events[0].kv.mod_revision, &events[0].kv.value[..]), (r3, &b"3"[..]));
    }

    pub async fn lease_expiry_deletes_keys_and_emits_delete_events(b: Backend) {
        let s = &b.store;
        let lease = s.grant_lease(SHORT_TTL).await.unwrap();
        s.put("l/k", b"v".to_vec(), Some(lease)).await.unwrap();
        s.put("l/keep", b"v".to_vec(), None).await.unwrap();
        assert_eq!(s.get("l/k").await.unwrap().unwrap().lease, lease);
        let mut watch = s.watch("l/", 0).await.unwrap();
        let events = next_events(&mut watch, 1).await;
        assert_eq!((events[0].kind, events[0].kv.key.as_str()), (EventKind::Delete, "l/k"));
        assert_eq!(s.get("l/k").await.unwrap(), None);
        assert!(s.get("l/keep").await.unwrap().is_some(), "keys without the lease stay");
    }

    pub async fn revoke_deletes_attached_keys_at_one_new_revision(b: Backend) {
        let s = &b.store;
        let lease = s.grant_lease(Duration::from_secs(60)).await.unwrap();
        s.put("r/1", b"1".to_vec(), Some(lease)).await.unwrap();
        s.put("r/2", b"2".to_vec(), Some(lease)).await.unwrap();
        s.put("r/3", b"3".to_vec(), None).await.unwrap();
        let before = s.current_revision().await.unwrap();
        let mut watch = s.watch("r/", 0).await.unwrap();
        s.revoke_lease(lease).await.unwrap();
        assert_eq!(s.current_revision().await.unwrap(), before + 1);
        let batch = next_batch(&mut watch).await;
        let deleted: Vec<&str> = batch.events.iter().map(|e| e.kv.key.as_str()).collect();
        assert_eq!(deleted.len(), 2, "both keys in one batch: {batch:?}");
        assert!(deleted.contains(&"r/1") && deleted.contains(&"r/2"));
        assert!(
            batch
                .events
                .iter()
                .all(|e| e.kind == EventKind::Delete && e.kv.mod_revision == before + 1)
        );
        let left: Vec<String> =
            s.list("r/").await.unwrap().kvs.into_iter().map(|kv| kv.key).collect();
        assert_eq!(left, ["r/3"]);
        assert!(
            matches!(s.revoke_lease(lease).await, Err(StoreError::LeaseNotFound(id)) if id == lease)
        );
    }

    pub async fn keep_alive_keeps_keys_past_their_ttl(b: Backend) {
        let s = &b.store;
        let lease = s.grant_lease(SHORT_TTL).await.unwrap();
        s.put("ka", b"v".to_vec(), Some(lease)).await.unwrap();
        let started = Instant::now();
        while started.elapsed() < SHORT_TTL * 3 {
            let ttl = s.keep_alive(lease).await.unwrap();
            assert!(ttl >= SHORT_TTL, "keep_alive returns the full TTL, got {ttl:?}");
            assert!(s.get("ka").await.unwrap().is_some(), "key gone at {:?}", started.elapsed());
            // The renewal cadence is the scenario (a client renewing well within the TTL), in
            // the wall time both stores expire leases by.
            tokio::time::sleep(SHORT_TTL / 4).await;
        }
        // Without renewals the key goes, so the renewals are what kept it.
        eventually("the key expires once renewals stop", || async {
            s.get("ka").await.unwrap().is_none()
        })
        .await;
    }

    pub async fn keep_alive_of_expired_lease_is_lease_not_found(b: Backend) {
        let s = &b.store;
        let lease = s.grant_lease(SHORT_TTL).await.unwrap();
        s.put("exp", b"v".to_vec(), Some(lease)).await.unwrap();
        eventually("the lease expires", || async { s.get("exp").await.unwrap().is_none() }).await;
        match s.keep_alive(lease).await {
            Err(StoreError::LeaseNotFound(id)) => assert_eq!(id, lease),
            other => panic!("expected LeaseNotFound, got {other:?}"),
        }
    }

    pub async fn put_with_unknown_lease_is_lease_not_found(b: Backend) {
        let s = &b.store;
        match s.put("k", b"v".to_vec(), Some(0x1234_5678)).await {
            Err(StoreError::LeaseNotFound(id)) => assert_eq!(id, 0x1234_5678),
            other => panic!("expected LeaseNotFound, got {other:?}"),
        }
        assert_eq!(s.get("k").await.unwrap(), None);
    }

    pub async fn election_has_one_leader_and_hands_over_on_resign(b: Backend) {
        let s = b.store.clone();
        let la = s.grant_lease(Duration::from_secs(60)).await.unwrap();
        let lb = s.grant_lease(Duration::from_secs(60)).await.unwrap();
        let a = election::campaign(s.clone(), "/election/webhooks", "a", la).await.unwrap();
        assert!(a.is_leader().await.unwrap());
        let mut b_campaign =
            tokio::spawn(election::campaign(s.clone(), "/election/webhooks", "b", lb));
        eventually("b is in line", || async {
            s.list("/election/webhooks/").await.unwrap().kvs.len() == 2
        })
        .await;
        // Leading shows only as a finished campaign, not as a state to poll: a wrong one
        // finishes at once, so a while with b's campaign still pending proves it waits.
        assert!(
            tokio::time::timeout(Duration::from_millis(500), &mut b_campaign).await.is_err(),
            "b must not lead while a does"
        );
        let leader = election::leader(s.as_ref(), "/election/webhooks").await.unwrap().unwrap();
        assert_eq!((leader.key.as_str(), &leader.value[..]), (a.key(), &b"a"[..]));
        a.resign().await.unwrap();
        let b_lead = tokio::time::timeout(WAIT, b_campaign).await.unwrap().unwrap().unwrap();
        assert!(b_lead.is_leader().await.unwrap());
        let leader = election::leader(s.as_ref(), "/election/webhooks").await.unwrap().unwrap();
        assert_eq!(&leader.value[..], b"b");
    }

    pub async fn election_hands_over_when_the_leaders_lease_is_revoked(b: Backend) {
        let s = b.store.clone();
        let la = s.grant_lease(Duration::from_secs(60)).await.unwrap();
        let lb = s.grant_lease(Duration::from_secs(60)).await.unwrap();
        let a = election::campaign(s.clone(), "/election/x", "a", la).await.unwrap();
        let mut b_campaign = tokio::spawn(election::campaign(s.clone(), "/election/x", "b", lb));
        eventually("b is in line", || async {
            s.list("/election/x/").await.unwrap().kvs.len() == 2
        })
        .await;
        // As above: leading shows only as a finished campaign, and a wrong one finishes at once.
        assert!(
            tokio::time::timeout(Duration::from_millis(500), &mut b_campaign).await.is_err(),
            "b must not lead while a does"
        );
        s.revoke_lease(la).await.unwrap();
        tokio::time::timeout(WAIT, a.lost()).await.unwrap().unwrap();
        let b_lead = tokio::time::timeout(WAIT, b_campaign).await.unwrap().unwrap().unwrap();
        assert!(b_lead.is_leader().await.unwrap());
        assert!(!a.is_leader().await.unwrap());
    }

    pub async fn campaign_fails_when_the_waiting_candidates_lease_is_revoked(b: Backend) {
        let s = b.store.clone();
        let la = s.grant_lease(Duration::from_secs(60)).await.unwrap();
        let lb = s.grant_lease(Duration::from_secs(60)).await.unwrap();
        let _a = election::campaign(s.clone(), "/election/y", "a", la).await.unwrap();
        let b_campaign = tokio::spawn(election::campaign(s.clone(), "/election/y", "b", lb));
        eventually("b is in line", || async {
            s.list("/election/y/").await.unwrap().kvs.len() == 2
        })
        .await;
        s.revoke_lease(lb).await.unwrap();
        match tokio::time::timeout(WAIT, b_campaign).await.unwrap().unwrap() {
            Err(StoreError::LeaseNotFound(id)) => assert_eq!(id, lb),
            Err(other) => panic!("expected LeaseNotFound, got {other}"),
            Ok(_) => panic!("b became leader while a leads"),
        }
    }
}

// === etcd only ===

mod etcd_only {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connect_to_a_dead_endpoint_fails_fast_and_clearly() {
        // Held, never listening: refused for as long as the test runs.
        let dead = port::ReservedPort::new();
        let endpoint = format!("http://{}", dead.addr());
        let started = Instant::now();
        match EtcdStore::connect(std::slice::from_ref(&endpoint)).await {
            Err(StoreError::Unavailable(message)) => {
                assert!(message.contains(&endpoint), "{message}");
            }
            Err(other) => panic!("expected Unavailable, got {other}"),
            Ok(_) => panic!("connected to nothing"),
        }
        assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connect_balances_over_endpoints_when_one_is_dead() {
        let etcd = etcd_process::EtcdProcess::start().await;
        let dead = port::ReservedPort::new();
        let endpoints = [format!("http://{}", dead.addr()), etcd.endpoint().to_owned()];
        let store = EtcdStore::connect(&endpoints).await.unwrap();
        for i in 0..5 {
            store.put(&format!("k{i}"), b"v".to_vec(), None).await.unwrap();
        }
        assert_eq!(store.list("k").await.unwrap().kvs.len(), 5);
    }
}

// === etcd with TLS and authentication only ===

mod etcd_tls_auth_only {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_user_limited_to_the_prefix_serves_every_operation_under_it() {
        let etcd = SecureEtcd::start("/switchyard/", None).await;
        let store = etcd.connect("/switchyard/").await.unwrap();
        let mut watch = store.watch("/switchyard/", 0).await.unwrap();
        let lease = store.grant_lease(SHORT_TTL).await.unwrap();
        store.put("/switchyard/a", b"1".to_vec(), Some(lease)).await.unwrap();
        store.keep_alive(lease).await.unwrap();
        assert_eq!(next_events(&mut watch, 1).await[0].kv.key, "/switchyard/a");
        assert_eq!(store.list("/switchyard/").await.unwrap().kvs.len(), 1);
        store.revoke_lease(lease).await.unwrap();
        assert!(store.get("/switchyard/a").await.unwrap().is_none());
        // Outside the prefix etcd refuses, and the error says who was refused and why.
        match store.put("/other/x", b"1".to_vec(), None).await {
            Err(StoreError::PermissionDenied(message)) => {
                assert!(message.contains("\"switchyard\""), "{message}");
                assert!(message.contains("permission denied"), "{message}");
            }
            other => panic!("expected PermissionDenied, got {other:?}"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_expired_token_is_replaced_and_the_call_succeeds() {
        let etcd = SecureEtcd::start("", Some(Duration::from_secs(1))).await;
        let store = etcd.connect("").await.unwrap();
        store.put("k", b"1".to_vec(), None).await.unwrap();
        assert_eq!(store.authentications(), 1);
        // The token must go unused past etcd's --auth-token-ttl (1 s, checked every second):
        // any call would renew it, so this waits rather than polls.
        tokio::time::sleep(Duration::from_secs(3)).await;
        store.put("k", b"2".to_vec(), None).await.unwrap();
        assert_eq!(store.authentications(), 2, "the expired token was replaced once");
        assert_eq!(&store.get("k").await.unwrap().unwrap().value[..], b"2");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wrong_password_fails_naming_the_user_and_never_the_password() {
        let etcd = SecureEtcd::start("", None).await;
        let mut options = etcd.options("");
        let wrong = "not-the-password-9f3a";
        options.credentials =
            Some(EtcdCredentials { user: "switchyard".into(), password: wrong.into() });
        match EtcdStore::connect_with(&etcd.cluster.endpoints(), options.clone()).await {
            Err(e @ StoreError::AuthFailed { .. }) => {
                let message = e.to_string();
                assert!(
                    message.contains("etcd authentication failed for user \"switchyard\""),
                    "{message}"
                );
                assert!(!message.contains(wrong), "{message}");
                assert!(!format!("{e:?}").contains(wrong));
            }
            Err(other) => panic!("expected AuthFailed, got {other}"),
            Ok(_) => panic!("connected with a wrong password"),
        }
        assert!(!format!("{options:?}").contains(wrong), "Debug of the options shows the password");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn without_credentials_etcd_refuses_and_says_so() {
        let etcd = SecureEtcd::start("", None).await;
        let mut options = etcd.options("");
        options.credentials = None;
        // etcd takes the client certificate's common name as the user, which has no role.
        match EtcdStore::connect_with(&etcd.cluster.endpoints(), options).await {
            Err(StoreError::PermissionDenied(message)) => {
                assert!(message.contains("SWITCHYARD_ETCD_USER"), "{message}");
            }
            Err(other) => panic!("expected PermissionDenied, got {other}"),
            Ok(_) => panic!("read from an etcd with auth on without credentials"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_member_certificate_from_another_ca_fails_naming_the_endpoint() {
        let etcd = SecureEtcd::start("", None).await;
        let other = pki::Ca::new("another CA");
        let mut options = etcd.options("");
        if let Some(tls) = options.tls.as_mut() {
            tls.ca = other.cert_path().to_owned();
        }
        let endpoint = etcd.cluster.endpoints()[0].clone();
        match EtcdStore::connect_with(std::slice::from_ref(&endpoint), options).await {
            Err(StoreError::Unavailable(message)) => {
                assert!(message.contains(&endpoint), "{message}");
                assert!(message.contains("certificate"), "{message}");
            }
            Err(other) => panic!("expected Unavailable, got {other}"),
            Ok(_) => panic!("trusted a member certificate from another CA"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_client_without_a_certificate_is_refused_by_client_cert_auth() {
        let etcd = SecureEtcd::start("", None).await;
        let mut options = etcd.options("");
        if let Some(tls) = options.tls.as_mut() {
            tls.identity = None;
        }
        let endpoint = etcd.cluster.endpoints()[0].clone();
        match EtcdStore::connect_with(std::slice::from_ref(&endpoint), options).await {
            Err(e) => assert!(e.to_string().contains(&endpoint), "{e}"),
            Ok(_) => panic!("etcd with --client-cert-auth served a client without a certificate"),
        }
    }

    #[tokio::test]
    async fn unusable_tls_files_are_refused_naming_the_flag_and_the_file() {
        let ca = pki::Ca::new("test CA");
        let leaf = ca.leaf("client", &["localhost"]);
        let garbage = ca.dir().join("garbage.pem");
        std::fs::write(&garbage, "not a certificate").unwrap();
        let missing = ca.dir().join("missing.pem");
        let endpoints = ["https://127.0.0.1:1".to_owned()];
        let cases = [
            ("--etcd-ca", garbage.clone(), None),
            ("--etcd-ca", missing.clone(), None),
            ("--etcd-cert", ca.cert_path().to_owned(), Some((garbage.clone(), leaf.key.clone()))),
            ("--etcd-key", ca.cert_path().to_owned(), Some((leaf.cert.clone(), missing.clone()))),
            // A certificate where the key should be: no private key in it.
            ("--etcd-key", ca.cert_path().to_owned(), Some((leaf.cert.clone(), leaf.cert.clone()))),
        ];
        for (flag, ca_path, identity) in cases {
            let bad = match (&identity, flag) {
                (Some((cert, _)), "--etcd-cert") => cert.clone(),
                (Some((_, key)), "--etcd-key") => key.clone(),
                _ => ca_path.clone(),
            };
            let options = EtcdOptions {
                tls: Some(EtcdTls { ca: ca_path, identity }),
                ..EtcdOptions::default()
            };
            match EtcdStore::connect_with(&endpoints, options).await {
                Err(e @ StoreError::TlsFile { .. }) => {
                    let message = e.to_string();
                    assert!(message.starts_with(flag), "{message}");
                    assert!(message.contains(&bad.display().to_string()), "{message}");
                }
                Err(other) => panic!("{flag} {}: expected TlsFile, got {other}", bad.display()),
                Ok(_) => panic!("{flag} {}: accepted", bad.display()),
            }
        }
    }

    #[tokio::test]
    async fn https_without_a_ca_and_plaintext_with_one_are_refused() {
        let https = ["https://127.0.0.1:1".to_owned()];
        match EtcdStore::connect_with(&https, EtcdOptions::default()).await {
            Err(e @ StoreError::InvalidUrl { .. }) => {
                assert!(e.to_string().contains("--etcd-ca"), "{e}")
            }
            other => panic!("expected InvalidUrl, got {:?}", other.err()),
        }
        let ca = pki::Ca::new("test CA");
        let options = EtcdOptions {
            tls: Some(EtcdTls { ca: ca.cert_path().to_owned(), identity: None }),
            ..EtcdOptions::default()
        };
        let http = ["http://127.0.0.1:1".to_owned()];
        match EtcdStore::connect_with(&http, options).await {
            Err(e @ StoreError::InvalidUrl { .. }) => {
                assert!(e.to_string().contains("https://"), "{e}")
            }
            other => panic!("expected InvalidUrl, got {:?}", other.err()),
        }
    }
}

// === Embedded store only ===

mod embedded_only {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn restart_keeps_data_revision_and_leases() {
        let dir = tempfile::tempdir().unwrap();
        let (lease, revision, plain, leased) = {
            let s = EmbeddedStore::open(dir.path()).await.unwrap();
            s.put("plain", b"1".to_vec(), None).await.unwrap();
            s.put("plain", b"2".to_vec(), None).await.unwrap();
            let lease = s.grant_lease(Duration::from_secs(30)).await.unwrap();
            s.put("leased", b"l".to_vec(), Some(lease)).await.unwrap();
            s.put("gone", b"x".to_vec(), None).await.unwrap();
            s.delete("gone").await.unwrap();
            let revision = s.current_revision().await.unwrap();
            let plain = s.get("plain").await.unwrap().unwrap();
            let leased = s.get("leased").await.unwrap().unwrap();
            s.close().await;
            (lease, revision, plain, leased)
        };
        let s = EmbeddedStore::open(dir.path()).await.unwrap();
        assert_eq!(s.current_revision().await.unwrap(), revision);
        assert_eq!(s.get("plain").await.unwrap().unwrap(), plain);
        assert_eq!(s.get("leased").await.unwrap().unwrap(), leased);
        assert_eq!(s.get("gone").await.unwrap(), None);
        assert_eq!(s.keep_alive(lease).await.unwrap(), Duration::from_secs(30), "lease restored");
        assert_eq!(s.put("plain", b"3".to_vec(), None).await.unwrap(), revision + 1);
        // Dropping (not closing) releases the directory too.
        drop(s);
        let s = EmbeddedStore::open(dir.path()).await.unwrap();
        assert_eq!(s.current_revision().await.unwrap(), revision + 1);
        assert_eq!(s.get("plain").await.unwrap().unwrap().version, 3);
        s.revoke_lease(lease).await.unwrap();
        assert_eq!(s.get("leased").await.unwrap(), None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn restarted_lease_expires_after_its_full_ttl() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = EmbeddedStore::open(dir.path()).await.unwrap();
            let lease = s.grant_lease(Duration::from_millis(800)).await.unwrap();
            s.put("k", b"v".to_vec(), Some(lease)).await.unwrap();
            s.close().await;
        }
        let reopened = Instant::now();
        let s = EmbeddedStore::open(dir.path()).await.unwrap();
        assert!(s.get("k").await.unwrap().is_some());
        eventually("the restored lease expires", || async { s.get("k").await.unwrap().is_none() })
            .await;
        assert!(reopened.elapsed() >= Duration::from_millis(800), "TTL restarted at reopen");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn second_open_of_the_same_dir_fails_clearly() {
        let dir = tempfile::tempdir().unwrap();
        let _first = EmbeddedStore::open(dir.path()).await.unwrap();
        match EmbeddedStore::open(dir.path()).await {
            Err(StoreError::Unavailable(message)) => {
                assert!(message.contains("in use"), "{message}");
                assert!(message.contains(&dir.path().display().to_string()), "{message}");
            }
            Err(other) => panic!("expected Unavailable, got {other}"),
            Ok(_) => panic!("a second open of a locked directory succeeded"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn history_is_bounded_by_the_retention_limit() {
        let dir = tempfile::tempdir().unwrap();
        let options = Options { retain_revisions: 10, ..Options::default() };
        let s = EmbeddedStore::open_with(dir.path(), options).await.unwrap();
        for i in 0..30 {
            s.put("k", i.to_string().into_bytes(), None).await.unwrap();
        }
        let current = s.current_revision().await.unwrap();
        let floor = current - 9;
        let mut watch = s.watch("k", 2).await.unwrap();
        match tokio::time::timeout(WAIT, watch.next()).await.unwrap() {
            Some(Err(StoreError::Compacted { compact_revision })) => {
                assert_eq!(compact_revision, floor)
            }
            other => panic!("expected Compacted, got {other:?}"),
        }
        let mut watch = s.watch("k", floor).await.unwrap();
        let events = next_events(&mut watch, 10).await;
        assert_eq!(events[0].kv.mod_revision, floor);
        assert_eq!(events[9].kv.mod_revision, current);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_watcher_that_falls_behind_retained_history_gets_compacted_then_ends() {
        let dir = tempfile::tempdir().unwrap();
        let options = Options { retain_revisions: 10, watch_buffer: 1, ..Options::default() };
        let s = EmbeddedStore::open_with(dir.path(), options).await.unwrap();
        let mut watch = s.watch("k", 0).await.unwrap();
        for i in 0..1000 {
            s.put("k", i.to_string().into_bytes(), None).await.unwrap();
        }
        let mut delivered = 0;
        loop {
            match tokio::time::timeout(WAIT, watch.next()).await.unwrap() {
                Some(Ok(batch)) => delivered += batch.events.len(),
                // The floor of retained history when the watcher was cut off: how far the
                // writer had got by then depends on scheduling, so it is bounded, not fixed.
                Some(Err(StoreError::Compacted { compact_revision })) => {
                    let floor_now = s.current_revision().await.unwrap() - 9;
                    assert!(
                        (1..=floor_now).contains(&compact_revision),
                        "compacted at {compact_revision}, retained history starts at {floor_now}"
                    );
                    break;
                }
                other => panic!("expected batches then Compacted, got {other:?}"),
            }
        }
        assert!(delivered < 1000, "the slow watcher was not cut off ({delivered} events)");
        assert!(tokio::time::timeout(WAIT, watch.next()).await.unwrap().is_none(), "stream ends");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn log_is_rewritten_into_a_snapshot_and_reloads() {
        let dir = tempfile::tempdir().unwrap();
        let options = Options { log_rewrite_bytes: 4096, ..Options::default() };
        let s = EmbeddedStore::open_with(dir.path(), options.clone()).await.unwrap();
        for i in 0..300 {
            s.put(&format!("k/{}", i % 20), vec![7; 64], None).await.unwrap();
        }
        let revision = s.current_revision().await.unwrap();
        let listing = s.list("k/").await.unwrap();
        s.close().await;
        let log_len = std::fs::metadata(dir.path().join("wal.jsonl")).unwrap().len();
        assert!(log_len <= 4096 + 1024, "log was not truncated: {log_len} bytes");
        assert!(dir.path().join("snapshot.json").exists());
        let s = EmbeddedStore::open_with(dir.path(), options).await.unwrap();
        assert_eq!(s.current_revision().await.unwrap(), revision);
        assert_eq!(s.list("k/").await.unwrap().kvs, listing.kvs);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_corrupt_record_before_the_end_fails_open_with_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let s = EmbeddedStore::open(dir.path()).await.unwrap();
        s.put("k", b"v".to_vec(), None).await.unwrap();
        s.close().await;
        let log_path = dir.path().join("wal.jsonl");
        let valid = std::fs::read(&log_path).unwrap();
        let mut damaged = b"{not json}\n".to_vec();
        damaged.extend_from_slice(&valid);
        std::fs::write(&log_path, damaged).unwrap();
        match EmbeddedStore::open(dir.path()).await {
            Err(StoreError::Corrupt(message)) => {
                assert!(message.contains("wal.jsonl"), "{message}")
            }
            Err(other) => panic!("expected Corrupt, got {other}"),
            Ok(_) => panic!("opened a corrupt log"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_torn_last_log_record_is_dropped_on_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let s = EmbeddedStore::open(dir.path()).await.unwrap();
        let revision = s.put("k", b"v".to_vec(), None).await.unwrap();
        s.close().await;
        let mut log =
            std::fs::OpenOptions::new().append(true).open(dir.path().join("wal.jsonl")).unwrap();
        std::io::Write::write_all(&mut log, b"{\"seq\":99,\"record\":{\"op\":\"comm").unwrap();
        drop(log);
        let s = EmbeddedStore::open(dir.path()).await.unwrap();
        assert_eq!(s.current_revision().await.unwrap(), revision);
        assert_eq!(s.put("k2", b"v".to_vec(), None).await.unwrap(), revision + 1);
    }

    /// The log and the snapshot, byte for byte, as the release before the embedded store was
    /// split into modules wrote them (lease IDs, which are random, stand as `LEASE`): a
    /// directory must open in the release before and after, so a change here is a format
    /// change, never a refactoring.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_log_and_the_snapshot_are_written_as_earlier_releases_wrote_them() {
        let dir = tempfile::tempdir().unwrap();
        let read = |file: &str, lease: i64| {
            std::fs::read_to_string(dir.path().join(file))
                .unwrap()
                .replace(&lease.to_string(), "LEASE")
        };
        let s = EmbeddedStore::open(dir.path()).await.unwrap();
        s.put("a", br#"{"x":1}"#.to_vec(), None).await.unwrap();
        s.put("b", b"plain text".to_vec(), None).await.unwrap();
        s.put("c", vec![0xff, 0x00], None).await.unwrap();
        let txn = Txn {
            compare: vec![Compare::absent("d")],
            success: vec![
                TxnOp::Delete { key: "b".into() },
                TxnOp::DeleteRange { start: "c".into(), end: "d".into() },
                TxnOp::Put { key: "d".into(), value: br#"{"y":[1,2]}"#.to_vec(), lease: None },
            ],
            failure: vec![],
        };
        s.txn(txn).await.unwrap();
        let revoked = s.grant_lease(Duration::from_secs(30)).await.unwrap();
        s.put("l", b"leased".to_vec(), Some(revoked)).await.unwrap();
        s.revoke_lease(revoked).await.unwrap();
        s.put("p/1", b"1".to_vec(), None).await.unwrap();
        let txn =
            Txn { success: vec![TxnOp::DeletePrefix { prefix: "p/".into() }], ..Txn::default() };
        s.txn(txn).await.unwrap();
        s.compact(s.current_revision().await.unwrap()).await.unwrap();
        s.close().await;
        let log = read("wal.jsonl", revoked);
        let expected_log = concat!(
            r#"{"seq":1,"record":{"op":"commit","changes":[{"kind":"put","key":"a","value":{"json":{"x":1}},"lease":0}]}}"#,
            "\n",
            r#"{"seq":2,"record":{"op":"commit","changes":[{"kind":"put","key":"b","value":{"text":"plain text"},"lease":0}]}}"#,
            "\n",
            r#"{"seq":3,"record":{"op":"commit","changes":[{"kind":"put","key":"c","value":{"hex":"ff00"},"lease":0}]}}"#,
            "\n",
            r#"{"seq":4,"record":{"op":"commit","changes":[{"kind":"delete","key":"b"},{"kind":"delete","key":"c"},{"kind":"put","key":"d","value":{"json":{"y":[1,2]}},"lease":0}]}}"#,
            "\n",
            r#"{"seq":5,"record":{"op":"grant","id":LEASE,"ttl_ms":30000}}"#,
            "\n",
            r#"{"seq":6,"record":{"op":"commit","changes":[{"kind":"put","key":"l","value":{"text":"leased"},"lease":LEASE}]}}"#,
            "\n",
            r#"{"seq":7,"record":{"op":"revoke","id":LEASE}}"#,
            "\n",
            r#"{"seq":8,"record":{"op":"commit","changes":[{"kind":"put","key":"p/1","value":{"json":1},"lease":0}]}}"#,
            "\n",
            r#"{"seq":9,"record":{"op":"commit","changes":[{"kind":"delete","key":"p/1"}]}}"#,
            "\n",
            r#"{"seq":10,"record":{"op":"compact","revision":9}}"#,
            "\n",
        );
        assert_eq!(log, expected_log);

        // Any write past a rewrite threshold of 0 bytes rewrites the snapshot.
        let options = Options { log_rewrite_bytes: 0, ..Options::default() };
        let s = EmbeddedStore::open_with(dir.path(), options).await.unwrap();
        let kept = s.grant_lease(Duration::from_secs(30)).await.unwrap();
        s.put("e", b"1".to_vec(), Some(kept)).await.unwrap();
        s.close().await;
        let snapshot = read("snapshot.json", kept);
        let expected_snapshot = concat!(
            r#"{"seq":12,"revision":10,"floor":9,"kvs":[{"key":"a","value":{"json":{"x":1}},"create_revision":2,"mod_revision":2,"version":1,"lease":0},"#,
            r#"{"key":"d","value":{"json":{"y":[1,2]}},"create_revision":5,"mod_revision":5,"version":1,"lease":0},"#,
            r#"{"key":"e","value":{"json":1},"create_revision":10,"mod_revision":10,"version":1,"lease":LEASE}],"#,
            r#""leases":[{"id":LEASE,"ttl_ms":30000}]}"#,
        );
        assert_eq!(snapshot, expected_snapshot);
        assert_eq!(read("wal.jsonl", kept), "", "the log is truncated after the rewrite");

        let s = EmbeddedStore::open(dir.path()).await.unwrap();
        let keys = s.list("").await.unwrap().kvs.into_iter().map(|kv| (kv.key, kv.value));
        let expected = [("a", &br#"{"x":1}"#[..]), ("d", br#"{"y":[1,2]}"#), ("e", b"1")];
        assert!(keys.eq(expected.map(|(k, v)| (k.to_owned(), bytes::Bytes::from_static(v)))));
    }
}
