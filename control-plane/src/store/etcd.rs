//! The etcd store: the [`Store`] trait over etcd's v3 gRPC API, with the client generated
//! from our own copy of etcd's protos (`switchyard_proto::etcd`).
//!
//! Several endpoints are used in order, not balanced: requests go to the current endpoint
//! until it fails at the transport level, then to the next one. (tonic's `balance_list`
//! keeps routing requests to a dead member and fails them, so it is not used.) Every member
//! of an etcd cluster serves linearizable reads and writes, so which one answers does not
//! matter. A failed request moves to the next endpoint at once when that cannot apply it
//! twice: reads, watches, lease grants and keep-alives always; writes only when the
//! connection was never established (nothing was sent). Otherwise the error is returned and
//! the next call uses the next endpoint.
//!
//! Known differences from the embedded store: etcd rounds lease TTLs up to whole seconds
//! and to its minimum; it keeps history until someone calls [`Store::compact`].
//!
//! Security ([`EtcdOptions`]): `https://` endpoints are verified against the given CA, with
//! an optional client certificate for etcd's `--client-cert-auth`. With credentials, the
//! store authenticates through etcd's `Auth.Authenticate` and sends the token with every
//! call; a token etcd no longer accepts (simple tokens expire after `--auth-token-ttl` of
//! disuse, and die with the member that issued them) is replaced once per call, on whichever
//! endpoint the call is at. Every call also says `hasleader`, so a member that has lost its
//! leader answers at once instead of letting the call wait out etcd's own timeout; such
//! calls were not applied, so they are sent again (here or to another member) until
//! [`LEADER_WAIT`] has passed, which covers an election, and then fail with an error that
//! says how many members are reachable and whether quorum is lost.

use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use parking_lot::Mutex;
use switchyard_proto::etcd as pb;
use switchyard_proto::etcd::auth_client::AuthClient;
use switchyard_proto::etcd::kv_client::KvClient;
use switchyard_proto::etcd::lease_client::LeaseClient;
use switchyard_proto::etcd::maintenance_client::MaintenanceClient;
use switchyard_proto::etcd::watch_client::WatchClient;
use switchyard_tls::connect::{ClientTls, is_https};
use switchyard_tls::files::Source;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Channel, Endpoint};

use super::api::{
    Compare, CompareOp, CompareTarget, EventKind, KeyListing, KeyValue, LeaseId, Listing, Revision,
    Store, StoreError, Txn, TxnOp, TxnResult, WatchBatch, WatchEvent, WatchStream,
};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Bound on every call: etcd answers in milliseconds when it has a leader, and a caller is
/// better served by an error than by waiting out an election forever.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Keys in the first page when listing; later pages are sized from what the first held.
const LIST_PAGE: i64 = 1000;
/// What a listing's later pages aim for. Pages must be large: etcd counts every key left in
/// the range to answer each page (it returns the total), so a prefix of a million keys read
/// a thousand at a time visits its keys a thousand times over — 95 s instead of ~2 s
/// (docs/BENCHMARKS.md, "A million keys").
const LIST_PAGE_BYTES: usize = 8 * 1024 * 1024;
const MAX_LIST_PAGE: i64 = 200_000;
/// The largest response the client decodes (tonic's default is 4 MiB). A page of the audit
/// log holds batches of up to 1 MiB each; a page larger than this is asked for again in
/// fewer keys ([`EtcdStore::list`]).
const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;
const WATCH_BUFFER: usize = 64;
/// How long a call keeps trying while the members it reaches have no leader. etcd's
/// default election timeout is 1 s and an election after a leader's death takes about two
/// of them; beyond this, quorum is probably lost and the caller gets an error saying so.
pub const LEADER_WAIT: Duration = Duration::from_secs(3);
/// Pause between rounds over the endpoints while no member has a leader.
const LEADER_RETRY: Duration = Duration::from_millis(100);
/// How long a call may take before the cluster is checked for quorum (and again as often
/// while the call lasts): etcd answers in milliseconds when it has a leader.
const SLOW_CALL: Duration = Duration::from_secs(1);
/// Bound on each member's answer to the status probe behind a "no quorum" error.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// How to reach etcd besides its addresses. The default is plaintext without
/// authentication, for every key.
#[derive(Clone, Debug, Default)]
pub struct EtcdOptions {
    /// Required for `https://` endpoints.
    pub tls: Option<EtcdTls>,
    /// etcd authentication (`SWITCHYARD_ETCD_USER` / `SWITCHYARD_ETCD_PASSWORD`).
    pub credentials: Option<EtcdCredentials>,
    /// The keys this client reads and writes (the control plane's prefix; empty: all). The
    /// revision probe reads inside it, so an etcd user limited to the prefix suffices.
    pub key_scope: String,
}

/// The PEM files of `--etcd-ca`, `--etcd-cert` and `--etcd-key`.
#[derive(Clone, Debug)]
pub struct EtcdTls {
    /// The CA that signed the members' server certificates.
    pub ca: PathBuf,
    /// `(certificate, key)` presented to members that require client certificates.
    pub identity: Option<(PathBuf, PathBuf)>,
}

/// An etcd user name and password; Debug shows the name only.
#[derive(Clone)]
pub struct EtcdCredentials {
    pub user: String,
    pub password: String,
}

impl fmt::Debug for EtcdCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdCredentials")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

#[derive(Clone)]
pub struct EtcdStore {
    endpoints: Arc<Endpoints>,
    session: Arc<Session>,
    /// The key the revision probe reads (see [`EtcdOptions::key_scope`]).
    probe_key: Vec<u8>,
    /// The highest raft term etcd's answers carried (0: none yet).
    raft_term: Arc<AtomicU64>,
}

struct Endpoints {
    /// `(url, lazily connected channel)`, in the order given.
    channels: Vec<(String, Channel)>,
    current: AtomicUsize,
}

/// The authentication state shared by every call and endpoint. etcd replicates simple and
/// JWT tokens through raft, so one token serves every member.
struct Session {
    credentials: Option<EtcdCredentials>,
    token: Mutex<Token>,
    /// Held while authenticating, so that concurrent calls that find the token rejected
    /// authenticate once between them.
    refresh: tokio::sync::Mutex<()>,
    authentications: AtomicU64,
}

#[derive(Clone, Default)]
struct Token {
    /// Bumped on every authentication, so a call replaces only the token it was refused with.
    generation: u64,
    /// `None` before the first authentication, and when etcd has authentication disabled.
    value: Option<MetadataValue<Ascii>>,
    authenticated: bool,
}

/// The metadata of one call: the token it carries (by generation) and `hasleader`.
#[derive(Clone)]
struct Meta {
    generation: u64,
    token: Option<MetadataValue<Ascii>>,
}

impl Meta {
    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = self.request_without_leader(message);
        // etcd's require-leader flag: a member without a leader refuses the call at once
        // ("etcdserver: no leader") and ends watch streams, rather than leaving them idle.
        request.metadata_mut().insert("hasleader", MetadataValue::from_static("true"));
        request
    }

    /// For the status probe, which must be answered by members without a leader too.
    fn request_without_leader<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(token) = &self.token {
            request.metadata_mut().insert("token", token.clone());
        }
        request
    }
}

/// What the status probe found wrong with the cluster.
enum Trouble {
    /// A majority of the members is unreachable.
    NoQuorum(StoreError),
    /// Enough members are up but none has a leader (an election, or a partition).
    NoLeader(StoreError),
    /// A new leader was elected while the call waited.
    LeaderChanged(StoreError),
}

/// The responses whose header tells the raft term.
trait Headed {
    fn header(&self) -> Option<&pb::ResponseHeader>;
}

macro_rules! headed {
    ($($response:ty),* $(,)?) => {
        $(impl Headed for $response {
            fn header(&self) -> Option<&pb::ResponseHeader> {
                self.header.as_ref()
            }
        })*
    };
}

headed!(
    pb::RangeResponse,
    pb::PutResponse,
    pb::DeleteRangeResponse,
    pb::TxnResponse,
    pb::CompactionResponse,
    pb::LeaseGrantResponse,
    pb::LeaseRevokeResponse,
    pb::LeaseKeepAliveResponse,
);

/// A watch as set up by [`EtcdStore::watch`]: its request sender, the inbound stream and
/// etcd's confirmation.
impl<R, S> Headed for (R, S, pb::WatchResponse) {
    fn header(&self) -> Option<&pb::ResponseHeader> {
        self.2.header.as_ref()
    }
}

/// Why getting a token failed.
enum AuthFailure {
    /// This endpoint could not be reached: try the next one.
    Transport(StoreError),
    /// etcd answered: the same answer would come from every member.
    Refused(StoreError),
}

/// Whether a request may be sent again after an ambiguous failure.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Retry {
    Always,
    /// Only if it never left this process.
    IfNotSent,
}

// === impl EtcdStore ===

impl EtcdStore {
    /// Connects to `endpoints` (`http://host:port`) and checks that one of them answers.
    pub async fn connect(endpoints: &[String]) -> Result<Self, StoreError> {
        Self::connect_with(endpoints, EtcdOptions::default()).await
    }

    /// Connects to `endpoints` (`http://` or, with `options.tls`, `https://host:port`),
    /// authenticates when `options` has credentials, and checks that a member answers.
    pub async fn connect_with(
        endpoints: &[String],
        options: EtcdOptions,
    ) -> Result<Self, StoreError> {
        if endpoints.is_empty() {
            return Err(StoreError::InvalidUrl {
                url: String::new(),
                reason: "no etcd endpoint".into(),
            });
        }
        let tls = options.tls.as_ref().map(load_tls).transpose()?;
        let mut channels = Vec::with_capacity(endpoints.len());
        for url in endpoints {
            let endpoint = Endpoint::from_shared(url.clone())
                .map_err(|e| StoreError::InvalidUrl { url: url.clone(), reason: e.to_string() })?
                .connect_timeout(CONNECT_TIMEOUT)
                .tcp_nodelay(true)
                // Notices a dead member (e.g. a partitioned host) on long-lived watch streams.
                .http2_keep_alive_interval(Duration::from_secs(10))
                .keep_alive_timeout(Duration::from_secs(5))
                .keep_alive_while_idle(true);
            match (is_https(url), &tls) {
                (true, Some(tls)) => {
                    let connector = tls.connector(url).map_err(|e| StoreError::InvalidUrl {
                        url: url.clone(),
                        reason: e.to_string(),
                    })?;
                    channels.push((url.clone(), endpoint.connect_with_connector_lazy(connector)));
                    continue;
                }
                (true, None) => {
                    return Err(StoreError::InvalidUrl {
                        url: url.clone(),
                        reason: "an https:// etcd endpoint needs --etcd-ca (the CA that signed \
                                 the members' certificates)"
                            .into(),
                    });
                }
                (false, Some(_)) => {
                    return Err(StoreError::InvalidUrl {
                        url: url.clone(),
                        reason: "--etcd-ca is given but this endpoint is plaintext: use \
                                 https:// (or no scheme) for every endpoint"
                            .into(),
                    });
                }
                (false, None) => {}
            }
            channels.push((url.clone(), endpoint.connect_lazy()));
        }
        let probe_key =
            if options.key_scope.is_empty() { vec![0] } else { options.key_scope.into_bytes() };
        let session = Session {
            credentials: options.credentials,
            token: Mutex::new(Token::default()),
            refresh: tokio::sync::Mutex::new(()),
            authentications: AtomicU64::new(0),
        };
        let store = Self {
            endpoints: Arc::new(Endpoints { channels, current: AtomicUsize::new(0) }),
            session: Arc::new(session),
            probe_key,
            raft_term: Arc::new(AtomicU64::new(0)),
        };
        store.current_revision().await?;
        Ok(store)
    }

    /// How many times this store has authenticated to etcd (the first time included).
    pub fn authentications(&self) -> u64 {
        self.session.authentications.load(Ordering::Relaxed)
    }

    /// Runs `attempt` on the current endpoint, moving on to the next ones as `retry` allows.
    async fn call<T, F, Fut>(&self, what: &str, retry: Retry, attempt: F) -> Result<T, StoreError>
    where
        T: Headed,
        F: Fn(Channel, Meta) -> Fut,
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        let endpoints = &self.endpoints;
        let count = endpoints.channels.len();
        let started = Instant::now();
        // The raft term of the last answer: a later one in the status probe means the
        // leader changed after this call was sent (see `quorum_watchdog`).
        let mut term = self.raft_term.load(Ordering::Relaxed);
        let mut failures = Vec::new();
        let mut unreachable = 0;
        let mut leaderless = false;
        let mut reauthenticated = false;
        loop {
            let index = endpoints.current.load(Ordering::Relaxed) % count;
            let (url, channel) = &endpoints.channels[index];
            let meta = match self.session.meta(url, channel).await {
                Ok(meta) => Some(meta),
                Err(AuthFailure::Refused(e)) => return Err(e),
                Err(AuthFailure::Transport(e)) => {
                    failures.push(match e {
                        StoreError::Unavailable(message) => message,
                        other => other.to_string(),
                    });
                    None
                }
            };
            let (error, sent) = match meta {
                // Authenticating could not reach this member: nothing was sent.
                None => (None, false),
                Some(meta) => {
                    let outcome = tokio::select! {
                        outcome = tokio::time::timeout(
                            REQUEST_TIMEOUT,
                            attempt(channel.clone(), meta.clone()),
                        ) => outcome,
                        trouble = self.quorum_watchdog(what, term), if count > 1 => match trouble {
                            // A read held for a leader that died: send it again (to another
                            // member) until one is elected.
                            Trouble::NoLeader(error) | Trouble::LeaderChanged(error)
                                if retry == Retry::Always =>
                            {
                                leaderless = true;
                                failures.push(format!("{url}: no leader"));
                                advance(endpoints, index, count);
                                if started.elapsed() >= LEADER_WAIT {
                                    return Err(error);
                                }
                                // The next attempt is sent under the term the probe saw.
                                term = self.raft_term.load(Ordering::Relaxed);
                                continue;
                            }
                            // A write held that long is lost with the leader or cannot be
                            // committed: its caller learns now, rather than after etcd's
                            // request timeout, and may retry once a leader is elected.
                            Trouble::NoLeader(error)
                            | Trouble::NoQuorum(error)
                            | Trouble::LeaderChanged(error) => {
                                return Err(error);
                            }
                        },
                    };
                    match outcome {
                        Ok(Ok(response)) => {
                            if let Some(header) = response.header() {
                                self.raft_term.fetch_max(header.raft_term, Ordering::Relaxed);
                            }
                            return Ok(response);
                        }
                        // Refused before it was applied: safe to send again with a new token.
                        Ok(Err(status)) if is_token_refused(&status) && !reauthenticated => {
                            reauthenticated = true;
                            self.session.expire(meta.generation);
                            continue;
                        }
                        // Refused before it was proposed, or a read that lost its leader
                        // midway: safe to send again, once there is a leader.
                        Ok(Err(status))
                            if is_leaderless(&status)
                                || (retry == Retry::Always && is_leader_timeout(&status)) =>
                        {
                            leaderless = true;
                            failures.push(format!("{url}: {}", status.message()));
                            advance(endpoints, index, count);
                            if started.elapsed() >= LEADER_WAIT {
                                return Err(self.leaderless_error(what, &failures).await);
                            }
                            if (index + 1).is_multiple_of(count) {
                                tokio::time::sleep(LEADER_RETRY).await;
                            }
                            continue;
                        }
                        // The member lost its leader with the call under way (a read waiting for
                        // the leader's confirmation); whether quorum is gone is worth saying.
                        Ok(Err(status)) if is_leader_timeout(&status) && count > 1 => {
                            return Err(match self.quorum_error(what).await {
                                Some(error) => error,
                                None => self.status_error(what, &status),
                            });
                        }
                        Ok(Err(status)) if !is_transport_failure(&status) => {
                            return Err(self.status_error(what, &status));
                        }
                        Ok(Err(status)) => {
                            let sent = !is_connect_failure(&status);
                            (Some(transport_error(what, url, &status)), sent)
                        }
                        Err(_) => (
                            Some(StoreError::Unavailable(format!(
                                "etcd {what} at {url} timed out after {REQUEST_TIMEOUT:?}"
                            ))),
                            true,
                        ),
                    }
                }
            };
            advance(endpoints, index, count);
            unreachable += 1;
            if let Some(error) = error {
                if sent && retry == Retry::IfNotSent {
                    return Err(error);
                }
                failures.push(match &error {
                    StoreError::Unavailable(message) => message.clone(),
                    other => other.to_string(),
                });
            }
            if leaderless && started.elapsed() >= LEADER_WAIT {
                return Err(self.leaderless_error(what, &failures).await);
            }
            if leaderless {
                // Waiting for an election, with members that refuse at once: a pause per
                // member tried, not a busy loop.
                tokio::time::sleep(LEADER_RETRY).await;
            }
            if !leaderless && unreachable >= count {
                // A member that lost its peers only a moment ago may still believe in its
                // leader and let the call time out rather than say "no leader": ask.
                if count > 1
                    && let Some(error) = self.quorum_error(what).await
                {
                    return Err(error);
                }
                return Err(StoreError::Unavailable(format!(
                    "no etcd endpoint answered: {}",
                    failures.join("; ")
                )));
            }
        }
    }

    /// Resolves, with the error to return, once a call that is taking long (a read the
    /// member holds for a leader that just died, say) turns out to face a cluster without
    /// quorum or leader; never resolves while the cluster is fine, so slow but healthy calls
    /// (a large listing) go on.
    ///
    /// It also resolves when the cluster has moved to a later raft term than `term` (that of
    /// the last answer before the call): the leader changed while the call waited, and a
    /// proposal a follower forwarded to a dead leader is never answered before etcd's own
    /// request timeout (5 s plus two election timeouts) — while the caller, a node's event
    /// batch say, holds up other work.
    async fn quorum_watchdog(&self, what: &str, term: u64) -> Trouble {
        loop {
            tokio::time::sleep(SLOW_CALL).await;
            let (trouble, latest) = self.cluster_trouble(what).await;
            if let Some(trouble) = trouble {
                return trouble;
            }
            if term != 0 && latest > term {
                return Trouble::LeaderChanged(StoreError::Unavailable(format!(
                    "etcd's leader changed while the {what} waited (raft term {term} → \
                     {latest}); it may not have been applied, send it again"
                )));
            }
        }
    }

    /// The error for a call that found no leader for [`LEADER_WAIT`].
    async fn leaderless_error(&self, what: &str, failures: &[String]) -> StoreError {
        match self.quorum_error(what).await {
            Some(error) => error,
            None => StoreError::Unavailable(format!(
                "etcd {what} failed: the members it reached had no leader for {LEADER_WAIT:?} \
                 ({})",
                failures.join("; ")
            )),
        }
    }

    /// Asks every member whether it is up and follows a leader; when a majority is
    /// unreachable or none has a leader, the error that says so.
    async fn quorum_error(&self, what: &str) -> Option<StoreError> {
        self.cluster_trouble(what).await.0.map(|trouble| match trouble {
            Trouble::NoQuorum(error) | Trouble::NoLeader(error) | Trouble::LeaderChanged(error) => {
                error
            }
        })
    }

    /// What is wrong with the cluster, if anything, and the latest raft term a member
    /// reported.
    async fn cluster_trouble(&self, what: &str) -> (Option<Trouble>, u64) {
        let meta = self.session.current();
        let probes = self.endpoints.channels.iter().map(|(url, channel)| {
            let meta = meta.clone();
            async move {
                let mut client = MaintenanceClient::new(channel.clone());
                let status = client.status(meta.request_without_leader(pb::StatusRequest {}));
                match tokio::time::timeout(PROBE_TIMEOUT, status).await {
                    Ok(Ok(response)) => {
                        let status = response.into_inner();
                        (url, Some(status.leader != 0), status.raft_term)
                    }
                    _ => (url, None, 0),
                }
            }
        });
        let answers = futures_util::future::join_all(probes).await;
        let members = answers.len();
        let latest = answers.iter().map(|(_, _, term)| *term).max().unwrap_or(0);
        self.raft_term.fetch_max(latest, Ordering::Relaxed);
        let reachable = answers.iter().filter(|(_, up, _)| up.is_some()).count();
        let led = answers.iter().filter(|(_, up, _)| *up == Some(true)).count();
        let detail = answers
            .iter()
            .map(|(url, up, _)| match up {
                None => format!("{url} unreachable"),
                Some(false) => format!("{url} up, no leader"),
                Some(true) => format!("{url} up, has a leader"),
            })
            .collect::<Vec<_>>()
            .join("; ");
        let trouble = if reachable * 2 <= members {
            Some(Trouble::NoQuorum(StoreError::NoQuorum(format!(
                "etcd has no quorum ({reachable} of {members} members reachable): the {what} \
                 cannot be served until a majority is back ({detail})"
            ))))
        } else if led == 0 {
            Some(Trouble::NoLeader(StoreError::NoQuorum(format!(
                "etcd has no leader ({reachable} of {members} members reachable, none has a \
                 leader): the {what} cannot be served until one is elected ({detail})"
            ))))
        } else {
            None
        };
        (trouble, latest)
    }

    /// etcd's answer as a [`StoreError`], naming the user when etcd refused it access.
    fn status_error(&self, what: &str, status: &tonic::Status) -> StoreError {
        if status.code() == tonic::Code::PermissionDenied {
            let message = status.message();
            return StoreError::PermissionDenied(match &self.session.credentials {
                Some(credentials) => format!(
                    "etcd refused the {what} to user {:?}: {message} (its role needs readwrite \
                     on the control plane's key prefix)",
                    credentials.user
                ),
                None => format!(
                    "etcd refused the {what}: {message} (etcd has authentication on and no \
                     SWITCHYARD_ETCD_USER is set; it took the client certificate's name as \
                     the user, if any)"
                ),
            });
        }
        status_error(what, status)
    }

    async fn range(
        &self,
        what: &str,
        request: pb::RangeRequest,
    ) -> Result<pb::RangeResponse, StoreError> {
        self.call(what, Retry::Always, |channel, meta| {
            let request = meta.request(request.clone());
            async move {
                KvClient::new(channel)
                    .max_decoding_message_size(MAX_RESPONSE_BYTES)
                    .range(request)
                    .await
                    .map(tonic::Response::into_inner)
            }
        })
        .await
    }
}

// === impl Session ===

impl Session {
    /// The metadata for a call on `channel`: authenticates there first when the store has
    /// credentials and no token yet.
    async fn meta(&self, url: &str, channel: &Channel) -> Result<Meta, AuthFailure> {
        let token = self.token();
        if self.credentials.is_none() || token.authenticated {
            return Ok(Meta { generation: token.generation, token: token.value });
        }
        self.authenticate(url, channel, token.generation).await
    }

    /// The metadata with the current token, without authenticating.
    fn current(&self) -> Meta {
        let token = self.token();
        Meta { generation: token.generation, token: token.value }
    }

    fn token(&self) -> Token {
        self.token.lock().clone()
    }

    /// Drops the token of `generation` (etcd refused it), unless another call replaced it.
    fn expire(&self, generation: u64) {
        let mut token = self.token.lock();
        if token.generation == generation {
            token.authenticated = false;
        }
    }

    /// Gets a token through `channel`, unless another call did since `generation`.
    async fn authenticate(
        &self,
        url: &str,
        channel: &Channel,
        generation: u64,
    ) -> Result<Meta, AuthFailure> {
        let Some(credentials) = &self.credentials else {
            return Ok(self.current());
        };
        let _refreshing = self.refresh.lock().await;
        let token = self.token();
        if token.authenticated && token.generation != generation {
            return Ok(Meta { generation: token.generation, token: token.value });
        }
        let request = pb::AuthenticateRequest {
            name: credentials.user.clone(),
            password: credentials.password.clone(),
        };
        let answer = tokio::time::timeout(
            REQUEST_TIMEOUT,
            AuthClient::new(channel.clone()).authenticate(request),
        )
        .await;
        let user = &credentials.user;
        let value = match answer {
            Err(_) => {
                return Err(AuthFailure::Transport(StoreError::Unavailable(format!(
                    "etcd authentication at {url} timed out after {REQUEST_TIMEOUT:?}"
                ))));
            }
            Ok(Ok(response)) => {
                let token = response.into_inner().token;
                let value = MetadataValue::try_from(token.as_str()).map_err(|_| {
                    AuthFailure::Refused(StoreError::AuthFailed {
                        user: user.clone(),
                        reason: "etcd sent a token that is not ASCII".into(),
                    })
                })?;
                Some(value)
            }
            Ok(Err(status)) if status.message().contains("authentication is not enabled") => {
                // As etcd's own client does: credentials for a cluster without authentication
                // are not an error (auth may be enabled later; calls then ask again).
                tracing::warn!(
                    user = %user,
                    "etcd has authentication disabled: calls are sent without a token"
                );
                None
            }
            Ok(Err(status)) if status.message().contains("authentication failed") => {
                return Err(AuthFailure::Refused(StoreError::AuthFailed {
                    user: user.clone(),
                    reason: "wrong user name or password".into(),
                }));
            }
            // Authenticate goes through raft: in an election it fails like any write, and
            // the credentials are not what is wrong.
            Ok(Err(status))
                if is_transport_failure(&status)
                    || is_leaderless(&status)
                    || is_leader_timeout(&status) =>
            {
                return Err(AuthFailure::Transport(transport_error(
                    "authentication",
                    url,
                    &status,
                )));
            }
            Ok(Err(status)) => {
                return Err(AuthFailure::Refused(StoreError::AuthFailed {
                    user: user.clone(),
                    reason: format!("etcd answered {:?}: {}", status.code(), status.message()),
                }));
            }
        };
        self.authentications.fetch_add(1, Ordering::Relaxed);
        let mut token = self.token.lock();
        *token = Token { generation: token.generation + 1, value, authenticated: true };
        Ok(Meta { generation: token.generation, token: token.value.clone() })
    }
}

#[async_trait]
impl Store for EtcdStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        let request = pb::RangeRequest { key: key.as_bytes().to_vec(), ..Default::default() };
        let response = self.range("get", request).await?;
        response.kvs.into_iter().next().map(from_pb_kv).transpose()
    }

    async fn list(&self, prefix: &str) -> Result<Listing, StoreError> {
        let (mut key, range_end) = prefix_range(prefix);
        let mut kvs = Vec::new();
        // Later pages are read at the first page's revision, so the listing is one snapshot.
        let mut revision = 0;
        let mut limit = LIST_PAGE;
        loop {
            let request = pb::RangeRequest {
                key: key.clone(),
                range_end: range_end.clone(),
                limit,
                revision,
                ..Default::default()
            };
            let page = match self.range("list", request).await {
                // Large values (batches of events): the same page again, in fewer keys.
                Err(StoreError::ResponseTooLarge(_)) if limit > 1 => {
                    limit = (limit / 8).max(1);
                    continue;
                }
                page => page?,
            };
            if revision == 0 {
                revision = header_revision(page.header.as_ref());
            }
            let more = page.more;
            let bytes: usize = page.kvs.iter().map(|kv| kv.key.len() + kv.value.len()).sum();
            if let Some(per_kv) = bytes.checked_div(page.kvs.len()) {
                let fits = LIST_PAGE_BYTES / per_kv.max(1);
                limit = i64::try_from(fits).unwrap_or(MAX_LIST_PAGE).clamp(1, MAX_LIST_PAGE);
            }
            let mut last = None;
            for kv in page.kvs {
                last = Some(kv.key.clone());
                kvs.push(from_pb_kv(kv)?);
            }
            match last {
                Some(mut last) if more => {
                    last.push(0);
                    key = last;
                }
                _ => break,
            }
        }
        Ok(Listing { kvs, revision })
    }

    async fn list_keys(
        &self,
        prefix: &str,
        from: &str,
        limit: usize,
    ) -> Result<KeyListing, StoreError> {
        if limit == 0 {
            // etcd reads limit 0 as "no limit".
            return Ok(KeyListing { keys: Vec::new(), revision: self.current_revision().await? });
        }
        let (start, range_end) = prefix_range(prefix);
        let start =
            if from.as_bytes() > start.as_slice() { from.as_bytes().to_vec() } else { start };
        let request = pb::RangeRequest {
            key: start,
            range_end,
            limit: i64::try_from(limit).unwrap_or(i64::MAX),
            keys_only: true,
            ..Default::default()
        };
        let response = self.range("list keys", request).await?;
        let keys = response.kvs.into_iter().map(|kv| utf8_key(kv.key)).collect::<Result<_, _>>()?;
        Ok(KeyListing { keys, revision: header_revision(response.header.as_ref()) })
    }

    async fn list_page(
        &self,
        prefix: &str,
        from: &str,
        limit: usize,
    ) -> Result<Listing, StoreError> {
        if limit == 0 {
            // etcd reads limit 0 as "no limit".
            return Ok(Listing { kvs: Vec::new(), revision: self.current_revision().await? });
        }
        let (start, range_end) = prefix_range(prefix);
        let start =
            if from.as_bytes() > start.as_slice() { from.as_bytes().to_vec() } else { start };
        let mut limit = i64::try_from(limit).unwrap_or(i64::MAX);
        loop {
            let request = pb::RangeRequest {
                key: start.clone(),
                range_end: range_end.clone(),
                limit,
                ..Default::default()
            };
            match self.range("list page", request).await {
                // Large values: fewer keys in this page; the caller pages on.
                Err(StoreError::ResponseTooLarge(_)) if limit > 1 => limit = (limit / 8).max(1),
                page => {
                    let page = page?;
                    let revision = header_revision(page.header.as_ref());
                    let kvs = page.kvs.into_iter().map(from_pb_kv).collect::<Result<_, _>>()?;
                    return Ok(Listing { kvs, revision });
                }
            }
        }
    }

    async fn count(&self, prefix: &str) -> Result<(usize, Revision), StoreError> {
        let (key, range_end) = prefix_range(prefix);
        let request = pb::RangeRequest { key, range_end, count_only: true, ..Default::default() };
        let response = self.range("count", request).await?;
        Ok((
            usize::try_from(response.count).unwrap_or(0),
            header_revision(response.header.as_ref()),
        ))
    }

    async fn put(
        &self,
        key: &str,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    ) -> Result<Revision, StoreError> {
        let lease = lease.unwrap_or(0);
        let request = pb::PutRequest { key: key.as_bytes().to_vec(), value, lease, prev_kv: false };
        let response = self
            .call("put", Retry::IfNotSent, |channel, meta| {
                let request = meta.request(request.clone());
                async move { KvClient::new(channel).put(request).await.map(tonic::Response::into_inner) }
            })
            .await
            .map_err(|e| lease_error(e, lease))?;
        Ok(header_revision(response.header.as_ref()))
    }

    async fn delete(&self, key: &str) -> Result<bool, StoreError> {
        let request = pb::DeleteRangeRequest { key: key.as_bytes().to_vec(), ..Default::default() };
        let response = self
            .call("delete", Retry::IfNotSent, |channel, meta| {
                let request = meta.request(request.clone());
                async move {
                    KvClient::new(channel)
                        .delete_range(request)
                        .await
                        .map(tonic::Response::into_inner)
                }
            })
            .await?;
        Ok(response.deleted > 0)
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResult, StoreError> {
        txn.check_ranges()?;
        let first_lease = txn
            .success
            .iter()
            .chain(&txn.failure)
            .find_map(|op| match op {
                TxnOp::Put { lease: Some(l), .. } if *l != 0 => Some(*l),
                _ => None,
            })
            .unwrap_or(0);
        let request = pb::TxnRequest {
            compare: txn.compare.into_iter().map(to_pb_compare).collect(),
            success: txn.success.into_iter().map(to_pb_op).collect(),
            failure: txn.failure.into_iter().map(to_pb_op).collect(),
        };
        let response = self
            .call("txn", Retry::IfNotSent, |channel, meta| {
                let request = meta.request(request.clone());
                async move { KvClient::new(channel).txn(request).await.map(tonic::Response::into_inner) }
            })
            .await
            .map_err(|e| lease_error(e, first_lease))?;
        Ok(TxnResult {
            succeeded: response.succeeded,
            revision: header_revision(response.header.as_ref()),
        })
    }

    async fn watch(&self, prefix: &str, from: Revision) -> Result<WatchStream, StoreError> {
        let (key, range_end) = prefix_range(prefix);
        let create = pb::WatchRequest {
            request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
                pb::WatchCreateRequest {
                    key,
                    range_end,
                    start_revision: from.max(0),
                    ..Default::default()
                },
            )),
        };
        // Returning only once etcd confirmed the watch guarantees that a write made after
        // `watch()` returns is seen, as with the embedded store.
        let (requests, mut inbound, first) = self
            .call("watch", Retry::Always, |channel, meta| {
                let create = create.clone();
                async move {
                    let (requests, request_rx) = mpsc::channel(1);
                    requests
                        .send(create)
                        .await
                        .map_err(|_| tonic::Status::internal("watch request dropped"))?;
                    let mut inbound = WatchClient::new(channel)
                        .watch(meta.request(ReceiverStream::new(request_rx)))
                        .await?
                        .into_inner();
                    match inbound.message().await? {
                        Some(first) => Ok((requests, inbound, first)),
                        None => Err(tonic::Status::unavailable("etcd closed the watch stream")),
                    }
                }
            })
            .await?;

        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        tokio::spawn(async move {
            // The request half must stay open: etcd ends the watch when the client stops sending.
            let _requests = requests;
            let mut next = Some(first);
            loop {
                let response = match next.take() {
                    Some(response) => response,
                    None => {
                        let message = tokio::select! {
                            message = inbound.message() => message,
                            () = tx.closed() => return,
                        };
                        match message {
                            Ok(Some(response)) => response,
                            Ok(None) => {
                                let closed =
                                    StoreError::Unavailable("etcd closed the watch stream".into());
                                let _ = tx.send(Err(closed)).await;
                                return;
                            }
                            Err(status) => {
                                let _ = tx.send(Err(status_error("watch", &status))).await;
                                return;
                            }
                        }
                    }
                };
                if response.compact_revision != 0 {
                    let compact_revision = response.compact_revision;
                    let _ = tx.send(Err(StoreError::Compacted { compact_revision })).await;
                    return;
                }
                if response.canceled {
                    let reason = format!("etcd canceled the watch: {}", response.cancel_reason);
                    let _ = tx.send(Err(StoreError::Unavailable(reason))).await;
                    return;
                }
                if response.events.is_empty() {
                    continue;
                }
                let events =
                    response.events.into_iter().map(from_pb_event).collect::<Result<Vec<_>, _>>();
                let item = events.map(|events| WatchBatch { events });
                let failed = item.is_err();
                if tx.send(item).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(WatchStream::new(rx))
    }

    async fn compact(&self, revision: Revision) -> Result<(), StoreError> {
        let request = pb::CompactionRequest { revision, physical: false };
        // Compaction is idempotent, so it can always be sent again.
        let result = self
            .call("compact", Retry::Always, |channel, meta| async move {
                KvClient::new(channel)
                    .compact(meta.request(request))
                    .await
                    .map(tonic::Response::into_inner)
            })
            .await;
        match result {
            // Compacting again at or below the floor is a no-op, as in the embedded store.
            Ok(_) | Err(StoreError::Compacted { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn current_revision(&self) -> Result<Revision, StoreError> {
        // One key inside the client's scope: a user limited to the prefix may read it.
        let request = pb::RangeRequest {
            key: self.probe_key.clone(),
            limit: 1,
            count_only: true,
            ..Default::default()
        };
        let response = self.range("range", request).await?;
        Ok(header_revision(response.header.as_ref()))
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId, StoreError> {
        let mut seconds = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX);
        if ttl.subsec_nanos() > 0 {
            seconds = seconds.saturating_add(1);
        }
        let request = pb::LeaseGrantRequest { ttl: seconds.max(1), id: 0 };
        // A grant sent twice leaves one unused lease behind, which expires on its own.
        let response = self
            .call("lease grant", Retry::Always, |channel, meta| async move {
                LeaseClient::new(channel)
                    .lease_grant(meta.request(request))
                    .await
                    .map(tonic::Response::into_inner)
            })
            .await?;
        if !response.error.is_empty() {
            return Err(StoreError::Unavailable(format!(
                "etcd refused the lease: {}",
                response.error
            )));
        }
        Ok(response.id)
    }

    async fn keep_alive(&self, id: LeaseId) -> Result<Duration, StoreError> {
        // One short stream per renewal: callers renew every few seconds at most, and this
        // keeps no background state to clean up.
        let response = self
            .call("lease keep-alive", Retry::Always, |channel, meta| async move {
                let (requests, request_rx) = mpsc::channel(1);
                requests
                    .send(pb::LeaseKeepAliveRequest { id })
                    .await
                    .map_err(|_| tonic::Status::internal("keep-alive request dropped"))?;
                let mut inbound = LeaseClient::new(channel)
                    .lease_keep_alive(meta.request(ReceiverStream::new(request_rx)))
                    .await?
                    .into_inner();
                let response = inbound.message().await?;
                drop(requests);
                response
                    .ok_or_else(|| tonic::Status::unavailable("etcd closed the keep-alive stream"))
            })
            .await
            .map_err(|e| lease_error(e, id))?;
        if response.ttl <= 0 {
            return Err(StoreError::LeaseNotFound(id));
        }
        Ok(Duration::from_secs(u64::try_from(response.ttl).unwrap_or(0)))
    }

    async fn revoke_lease(&self, id: LeaseId) -> Result<(), StoreError> {
        // Revoking twice is harmless: the second attempt reports the lease as not found.
        self.call("lease revoke", Retry::Always, |channel, meta| async move {
            LeaseClient::new(channel)
                .lease_revoke(meta.request(pb::LeaseRevokeRequest { id }))
                .await
                .map(tonic::Response::into_inner)
        })
        .await
        .map_err(|e| lease_error(e, id))?;
        Ok(())
    }
}

// === Conversions ===

/// Failures of the connection rather than answers from etcd (whose own errors, even those
/// with code `Unavailable`, carry an `etcdserver:` or `mvcc:` message).
fn is_transport_failure(status: &tonic::Status) -> bool {
    let message = status.message();
    matches!(
        status.code(),
        tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled
    ) && !message.starts_with("etcdserver:")
        && !message.starts_with("mvcc:")
}

/// etcd refused the call's token (expired, unknown to a restarted member, issued before the
/// auth store changed) or got none while authentication is on; the call was not applied.
fn is_token_refused(status: &tonic::Status) -> bool {
    let message = status.message();
    message.contains("etcdserver: invalid auth token")
        || message.contains("etcdserver: revision of auth store is old")
        || message.contains("etcdserver: user name is empty")
}

/// The member has no leader: it refused the call before proposing or reading anything
/// (`hasleader`), or raft dropped the proposal for want of a leader.
fn is_leaderless(status: &tonic::Status) -> bool {
    let message = status.message();
    message.contains("etcdserver: no leader") || message.contains("raft proposal dropped")
}

/// etcd gave up on a call waiting for its leader (`ErrTimeout` and its variants, or the
/// leader changed under a read).
fn is_leader_timeout(status: &tonic::Status) -> bool {
    let message = status.message();
    message.contains("etcdserver: request timed out")
        || message.contains("etcdserver: leader changed")
}

fn advance(endpoints: &Endpoints, index: usize, count: usize) {
    // Another caller may have moved on already; don't skip a healthy endpoint.
    let _ = endpoints.current.compare_exchange(
        index,
        (index + 1) % count,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
}

/// A failure to reach `url`, naming it (TLS failures included: "invalid peer certificate").
fn transport_error(what: &str, url: &str, status: &tonic::Status) -> StoreError {
    let cause = describe(status);
    if cause.contains("TLS handshake with") {
        return StoreError::Unavailable(format!("etcd {what} at {url} failed: {cause}"));
    }
    if cause.contains("invalid peer certificate") || cause.to_ascii_lowercase().contains("tls") {
        return StoreError::Unavailable(format!(
            "etcd {what} at {url} failed: TLS handshake with {url} failed: {cause}"
        ));
    }
    StoreError::Unavailable(format!("etcd {what} at {url} failed ({:?}): {cause}", status.code()))
}

/// Reads and checks the TLS files, so that a wrong one stops the start naming its flag and
/// file. The connections it makes re-read them when they change (a rotated client
/// certificate or CA needs no restart).
fn load_tls(tls: &EtcdTls) -> Result<ClientTls, StoreError> {
    let identity = tls
        .identity
        .as_ref()
        .map(|(cert, key)| (Source::new("--etcd-cert", cert), Source::new("--etcd-key", key)));
    ClientTls::new(Some(Source::new("--etcd-ca", &tls.ca)), identity)
        .map_err(|e| StoreError::TlsFile(e.to_string()))
}

/// The status's message followed by its causes (a transport error's message alone is just
/// "tcp connect error"; the cause says "Connection refused").
fn describe(status: &tonic::Status) -> String {
    let mut chain = status.message().to_owned();
    let mut source = std::error::Error::source(status);
    while let Some(cause) = source {
        let text = cause.to_string();
        if !chain.contains(&text) {
            chain.push_str(": ");
            chain.push_str(&text);
        }
        source = cause.source();
    }
    chain
}

/// The connection could not be set up, so the request was certainly not sent.
fn is_connect_failure(status: &tonic::Status) -> bool {
    let chain = describe(status).to_ascii_lowercase();
    chain.contains("connect error")
        || chain.contains("connection refused")
        || chain.contains("error trying to connect")
        // A failed TLS handshake sends no request either.
        || chain.contains("invalid peer certificate")
        || chain.contains("handshake")
}

/// etcd reports its domain errors as gRPC statuses with fixed messages (rpctypes in etcd's
/// source); the ones the trait names get their own variant.
fn status_error(what: &str, status: &tonic::Status) -> StoreError {
    let message = status.message();
    if message.contains("required revision has been compacted") {
        // The floor itself is not in the message; 0 says "unknown".
        return StoreError::Compacted { compact_revision: 0 };
    }
    if message.contains("lease not found") {
        return StoreError::LeaseNotFound(0);
    }
    if status.code() == tonic::Code::OutOfRange && message.contains("message length too large") {
        return StoreError::ResponseTooLarge(format!("etcd {what}: {message}"));
    }
    if status.code() == tonic::Code::InvalidArgument || message.contains("future revision") {
        return StoreError::InvalidRequest(format!("etcd refused the {what}: {message}"));
    }
    StoreError::Unavailable(format!(
        "etcd {what} failed ({:?}): {}",
        status.code(),
        describe(status)
    ))
}

/// Fills in the lease a `LeaseNotFound` from [`status_error`] is about.
fn lease_error(error: StoreError, lease: LeaseId) -> StoreError {
    match error {
        StoreError::LeaseNotFound(_) => StoreError::LeaseNotFound(lease),
        other => other,
    }
}

fn header_revision(header: Option<&pb::ResponseHeader>) -> Revision {
    header.map_or(0, |h| h.revision)
}

/// etcd's prefix convention: the range `[prefix, prefix with its last byte + 1)`; the
/// empty prefix is every key (`"\0"` to `"\0"`).
fn prefix_range(prefix: &str) -> (Vec<u8>, Vec<u8>) {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return (prefix.as_bytes().to_vec(), end);
        }
    }
    let key = if prefix.is_empty() { vec![0] } else { prefix.as_bytes().to_vec() };
    (key, vec![0])
}

fn utf8_key(key: Vec<u8>) -> Result<String, StoreError> {
    String::from_utf8(key)
        .map_err(|_| StoreError::Corrupt("etcd returned a key that is not UTF-8".into()))
}

fn from_pb_kv(kv: pb::KeyValue) -> Result<KeyValue, StoreError> {
    Ok(KeyValue {
        key: utf8_key(kv.key)?,
        value: kv.value.into(),
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        version: kv.version,
        lease: kv.lease,
    })
}

fn from_pb_event(event: pb::Event) -> Result<WatchEvent, StoreError> {
    let kind = if event.r#type == pb::event::EventType::Delete as i32 {
        EventKind::Delete
    } else {
        EventKind::Put
    };
    let kv = event
        .kv
        .ok_or_else(|| StoreError::Corrupt("etcd sent a watch event without a key".into()))?;
    Ok(WatchEvent { kind, kv: from_pb_kv(kv)? })
}

fn to_pb_compare(compare: Compare) -> pb::Compare {
    use pb::compare::{CompareResult, CompareTarget as Target, TargetUnion};
    let result = match compare.op {
        CompareOp::Equal => CompareResult::Equal,
        CompareOp::NotEqual => CompareResult::NotEqual,
        CompareOp::Greater => CompareResult::Greater,
        CompareOp::Less => CompareResult::Less,
    };
    let (target, union) = match compare.target {
        CompareTarget::Version(v) => (Target::Version, TargetUnion::Version(v)),
        CompareTarget::CreateRevision(r) => (Target::Create, TargetUnion::CreateRevision(r)),
        CompareTarget::ModRevision(r) => (Target::Mod, TargetUnion::ModRevision(r)),
        CompareTarget::Value(v) => (Target::Value, TargetUnion::Value(v)),
    };
    pb::Compare {
        result: result as i32,
        target: target as i32,
        key: compare.key.into_bytes(),
        target_union: Some(union),
    }
}

fn to_pb_op(op: TxnOp) -> pb::RequestOp {
    use pb::request_op::Request;
    let request = match op {
        TxnOp::Put { key, value, lease } => Request::RequestPut(pb::PutRequest {
            key: key.into_bytes(),
            value,
            lease: lease.unwrap_or(0),
            prev_kv: false,
        }),
        TxnOp::Delete { key } => Request::RequestDeleteRange(pb::DeleteRangeRequest {
            key: key.into_bytes(),
            ..Default::default()
        }),
        TxnOp::DeletePrefix { prefix } => {
            let (key, range_end) = prefix_range(&prefix);
            Request::RequestDeleteRange(pb::DeleteRangeRequest { key, range_end, prev_kv: false })
        }
        TxnOp::DeleteRange { start, end } => Request::RequestDeleteRange(pb::DeleteRangeRequest {
            key: start.into_bytes(),
            range_end: end.into_bytes(),
            prev_kv: false,
        }),
    };
    pb::RequestOp { request: Some(request) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_answers_are_classified_by_what_may_be_sent_again() {
        let invalid = tonic::Status::unauthenticated("etcdserver: invalid auth token");
        let old = tonic::Status::invalid_argument("etcdserver: revision of auth store is old");
        assert!(is_token_refused(&invalid) && is_token_refused(&old));
        let no_leader = tonic::Status::unavailable("etcdserver: no leader");
        assert!(is_leaderless(&no_leader) && !is_transport_failure(&no_leader));
        let timed_out = tonic::Status::unavailable("etcdserver: request timed out");
        assert!(is_leader_timeout(&timed_out) && !is_leaderless(&timed_out));
        let refused = tonic::Status::unavailable("tcp connect error");
        assert!(is_transport_failure(&refused) && is_connect_failure(&refused));
    }

    #[test]
    fn transport_errors_name_the_endpoint() {
        let status = tonic::Status::unavailable("invalid peer certificate: UnknownIssuer");
        let error = transport_error("range", "https://10.0.0.5:2379", &status).to_string();
        assert!(error.contains("https://10.0.0.5:2379"), "{error}");
        assert!(error.contains("TLS handshake"), "{error}");
    }

    #[test]
    fn credentials_debug_shows_the_user_only() {
        let credentials = EtcdCredentials { user: "switchyard".into(), password: "hunter2".into() };
        let options = EtcdOptions { credentials: Some(credentials), ..EtcdOptions::default() };
        let shown = format!("{options:?}");
        assert!(shown.contains("switchyard") && !shown.contains("hunter2"), "{shown}");
    }

    #[test]
    fn prefix_range_increments_the_last_byte() {
        assert_eq!(prefix_range("a/"), (b"a/".to_vec(), b"a0".to_vec()));
        assert_eq!(prefix_range(""), (vec![0], vec![0]));
    }
}
