//! The router's driver: the engines with the load it tracks, the in-process index, the
//! tokenizer, and the decision (tokens → index rows → [`super::model::score`]) with its reservation:
//! local, or shared with the other replicas through the cluster ([`super::cluster`]), where a
//! decision and its reservation are one step (decide, write if nobody wrote since, else decide
//! again).

use super::cluster::{Miss, SharedSlots};
use super::metrics::RouterMetrics;
use super::model::accounting::{Accounting, Delivery};
use super::model::score::{self, Candidate, Load, Matched, Reported};
use super::tokenize::ModelTokenizer;
use super::upstream::{self, HttpClient};
use super::{EngineSpec, RouterConfig};
use crate::indexer::index::{LoraNs, QueryScope};
use crate::indexer::IndexerState;
use axum::body::Body;
use parking_lot::Mutex;
use serde_json::{Map, Value};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// One engine and what the router tracks of it.
#[derive(Debug)]
pub struct TrackedEngine {
    /// Its flag.
    pub spec: EngineSpec,
    /// Requests it takes at once from all replicas together (`None`: unlimited).
    pub slots: Option<u64>,
    in_flight: AtomicU64,
    waiting: AtomicU64,
    up: AtomicBool,
    /// The engine's own figures at the last scrape, with when.
    reported: Mutex<Option<(Reported, std::time::Instant)>>,
    /// How long a scrape counts (three `--engine-metrics-interval`s; `None`: not scraped).
    fresh_for: Option<std::time::Duration>,
}

impl TrackedEngine {
    fn new(
        spec: EngineSpec,
        default_slots: Option<u64>,
        scrape_every: Option<std::time::Duration>,
    ) -> Self {
        Self {
            slots: spec.slots.or(default_slots),
            reported: Mutex::new(None),
            fresh_for: scrape_every.map(|d| d * 3),
            spec,
            in_flight: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
            up: AtomicBool::new(true),
        }
    }

    /// The load the router tracks, with the engine's own figures when fresh.
    pub fn load(&self) -> Load {
        Load {
            in_flight: self.in_flight.load(Ordering::Relaxed),
            waiting: self.waiting.load(Ordering::Relaxed),
            reported: self.reported(),
        }
    }

    /// The engine's own figures from its last scrape, unless older than three intervals.
    pub fn reported(&self) -> Option<Reported> {
        let fresh_for = self.fresh_for?;
        self.reported
            .lock()
            .filter(|(_, at)| at.elapsed() <= fresh_for)
            .map(|(r, _)| r)
    }

    /// Keeps a scrape's figures.
    pub fn set_reported(&self, r: Reported) {
        *self.reported.lock() = Some((r, std::time::Instant::now()));
    }

    /// Whether requests are routed to it.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// Marks it up or down (a failed call, a health probe); returns the previous state.
    pub fn set_up(&self, up: bool) -> bool {
        self.up.swap(up, Ordering::Relaxed)
    }
}

/// A routed request's share of an engine's load, released when dropped.
#[derive(Debug)]
pub struct Reservation {
    engine: Arc<TrackedEngine>,
    waiting: bool,
    /// The shared reservation to release: the replicas' view, its id.
    shared: Option<(Arc<SharedSlots>, u64)>,
}

impl std::fmt::Debug for SharedSlots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedSlots")
            .field("replica", &self.replica)
            .finish_non_exhaustive()
    }
}

impl Reservation {
    /// A local share of `engine`, taken only while it holds fewer than `slots`.
    fn try_new(engine: Arc<TrackedEngine>, slots: Option<u64>) -> Option<Self> {
        engine
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (slots.is_none_or(|s| n < s)).then_some(n + 1)
            })
            .ok()?;
        engine.waiting.fetch_add(1, Ordering::Relaxed);
        Some(Self {
            engine,
            waiting: true,
            shared: None,
        })
    }

    /// A local share of `engine` whatever its slots (the shared write already took one).
    fn new(engine: Arc<TrackedEngine>) -> Self {
        engine.in_flight.fetch_add(1, Ordering::AcqRel);
        engine.waiting.fetch_add(1, Ordering::Relaxed);
        Self {
            engine,
            waiting: true,
            shared: None,
        }
    }

    /// The engine answered: no longer waiting.
    pub fn answered(&mut self) {
        if std::mem::take(&mut self.waiting) {
            self.engine.waiting.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The engine.
    pub fn engine(&self) -> &Arc<TrackedEngine> {
        &self.engine
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.answered();
        self.engine.in_flight.fetch_sub(1, Ordering::AcqRel);
        if let Some((shared, id)) = self.shared.take() {
            shared.release(&self.engine.spec.instance, id);
        }
    }
}

/// Why no engine took a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoRoute {
    /// No engine is up.
    NoneUp,
    /// Every engine up has all its slots held.
    Full,
    /// Every try to write a reservation met another replica's write.
    Contended,
}

/// Tries of one route-and-reserve before it gives up ([`NoRoute::Contended`]).
pub(crate) const ROUTE_ATTEMPTS: usize = 8;

/// The routing decision for one request.
#[derive(Debug)]
pub struct Decision {
    /// The engines as they were when the index was asked (every index below is into this).
    pub engines: Arc<Vec<Arc<TrackedEngine>>>,
    /// The prompt's tokens when known (`None`: not tokenized; routed on load only).
    pub tokens: Option<usize>,
    /// Per engine (same order as the engines): reusable cached tokens by the index.
    pub predicted: Vec<u64>,
    /// What the engine can reuse at most.
    pub reusable: u64,
    /// The prompt's chained block hashes in its namespace (LoRA, salt), when the blocks a
    /// request will add are shared with the other replicas (`--cluster`,
    /// `--share-blocks`); else empty.
    pub hashes: Vec<u64>,
}

impl Decision {
    /// The accounting figures once `engine` reported `delivered`.
    pub fn delivery(&self, engine: usize, delivered: u64) -> Delivery {
        Delivery {
            reusable: self.reusable,
            best: self.predicted.iter().copied().max().unwrap_or(0),
            predicted: self.predicted.get(engine).copied().unwrap_or(0),
            delivered,
        }
    }
}

/// Everything the router's routes and tasks share.
pub struct RouterState {
    /// The configuration.
    pub config: RouterConfig,
    /// The engines: `--engine`'s in flag order, then the discovered ones by instance.
    engines: parking_lot::RwLock<Arc<Vec<Arc<TrackedEngine>>>>,
    /// The in-process index.
    pub indexer: Arc<IndexerState>,
    /// The model's tokenizer (`None`: every prompt goes to an engine's `/tokenize`).
    pub tokenizer: Option<ModelTokenizer>,
    /// The upstream client.
    pub client: HttpClient,
    /// Counters.
    pub metrics: RouterMetrics,
    /// Predicted against delivered.
    pub accounting: Mutex<Accounting>,
    /// The reservations shared with the other replicas (`--cluster`).
    pub shared: Option<Arc<SharedSlots>>,
    /// The engine each session went to last.
    pub sessions: Mutex<super::model::sessions::Sessions>,
    rotate: AtomicUsize,
}

/// The request kinds the router routes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestKind {
    /// `/v1/completions`.
    Completion,
    /// `/v1/chat/completions`.
    Chat,
}

impl RouterState {
    /// The state for `config`, its index and tokenizer.
    pub fn new(
        config: RouterConfig,
        indexer: Arc<IndexerState>,
        tokenizer: Option<ModelTokenizer>,
        shared: Option<Arc<SharedSlots>>,
        metrics: RouterMetrics,
    ) -> Self {
        let engines = config
            .engines
            .iter()
            .cloned()
            .map(|s| {
                Arc::new(TrackedEngine::new(
                    s,
                    config.engine_slots,
                    config.engine_metrics_interval,
                ))
            })
            .collect();
        let engines = parking_lot::RwLock::new(Arc::new(engines));
        let client = upstream::client(config.connect_timeout);
        let session_ttl = config.session_ttl;
        Self {
            config,
            engines,
            indexer,
            tokenizer,
            client,
            metrics,
            accounting: Mutex::new(Accounting::default()),
            sessions: Mutex::new(super::model::sessions::Sessions::new(
                session_ttl,
                super::model::sessions::MAX_SESSIONS,
            )),
            shared,
            rotate: AtomicUsize::new(0),
        }
    }

    /// The engines now: `--engine`'s, then the discovered ones. A request keeps the list it
    /// was decided on; discovery replaces the list, never changes one.
    pub fn engines(&self) -> Arc<Vec<Arc<TrackedEngine>>> {
        Arc::clone(&self.engines.read())
    }

    /// Makes `discovered` (sorted by instance) the engines beyond `--engine`'s: an engine
    /// whose spec did not change is kept with its load; one gone stops being chosen (its
    /// requests in flight finish). The instances added and removed.
    pub fn set_discovered(&self, discovered: Vec<EngineSpec>) -> (Vec<String>, Vec<String>) {
        let mut list = self.engines.write();
        let fixed = self.config.engines.len();
        let old: Vec<Arc<TrackedEngine>> = list[fixed..].to_vec();
        let mut next: Vec<Arc<TrackedEngine>> = list[..fixed].to_vec();
        let mut added = Vec::new();
        for spec in discovered {
            match old.iter().find(|e| e.spec == spec) {
                Some(e) => next.push(Arc::clone(e)),
                None => {
                    added.push(spec.instance.clone());
                    next.push(Arc::new(TrackedEngine::new(
                        spec,
                        self.config.engine_slots,
                        self.config.engine_metrics_interval,
                    )));
                }
            }
        }
        let removed = old
            .iter()
            .filter(|e| !next[fixed..].iter().any(|n| Arc::ptr_eq(n, e)))
            .map(|e| e.spec.instance.clone())
            .collect();
        *list = Arc::new(next);
        (added, removed)
    }

    /// The prompt's token ids: given ids as they are, text through the local tokenizer, else
    /// through the first engine up that answers `/tokenize`. `None` when none could.
    pub async fn tokens(&self, kind: RequestKind, body: &Map<String, Value>) -> Option<Vec<u32>> {
        let prompt = match kind {
            RequestKind::Completion => first_prompt(body.get("prompt")?)?,
            RequestKind::Chat => PromptInput::Chat,
        };
        if let PromptInput::Ids(ids) = prompt {
            self.metrics.tokenized.with_label_values(&["ids"]).inc();
            return Some(ids);
        }
        if let Some(t) = &self.tokenizer {
            let local = match &prompt {
                PromptInput::Text(text) => {
                    let special = body
                        .get("add_special_tokens")
                        .and_then(Value::as_bool)
                        .unwrap_or(true);
                    t.encode(text, special)
                }
                _ if t.has_chat_template() => t.encode_chat(body),
                _ => Err("no chat template".into()),
            };
            match local {
                Ok(ids) => {
                    self.metrics.tokenized.with_label_values(&["local"]).inc();
                    return Some(ids);
                }
                Err(e) => tracing::debug!("local tokenization failed: {e}"),
            }
        }
        let ids = self.tokenize_remote(&prompt, body).await;
        let source = if ids.is_some() { "engine" } else { "failed" };
        self.metrics.tokenized.with_label_values(&[source]).inc();
        ids
    }

    async fn tokenize_remote(
        &self,
        prompt: &PromptInput,
        body: &Map<String, Value>,
    ) -> Option<Vec<u32>> {
        let mut req = Map::new();
        for key in [
            "model",
            "add_special_tokens",
            "chat_template_kwargs",
            "tools",
            "add_generation_prompt",
        ] {
            if let Some(v) = body.get(key) {
                req.insert(key.into(), v.clone());
            }
        }
        match prompt {
            PromptInput::Text(t) => {
                req.insert("prompt".into(), Value::String(t.clone()));
            }
            _ => {
                req.insert("messages".into(), body.get("messages")?.clone());
            }
        }
        let payload = serde_json::to_vec(&req).ok()?;
        for engine in self.engines().iter().filter(|e| e.is_up()) {
            let Ok(call) = hyper::Request::post(format!("{}/tokenize", engine.spec.url))
                .header("content-type", "application/json")
                .body(Body::from(payload.clone()))
            else {
                continue;
            };
            let deadline = self.config.connect_timeout * 2;
            let Ok(resp) = upstream::send(&self.client, call, deadline).await else {
                continue;
            };
            if !resp.status().is_success() {
                continue;
            }
            let Ok(bytes) = upstream::read_body(resp.into_body(), 16 << 20, deadline).await else {
                continue;
            };
            let v: Value = serde_json::from_slice(&bytes).ok()?;
            return v
                .get("tokens")?
                .as_array()?
                .iter()
                .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
                .collect();
        }
        None
    }

    /// What the index says each engine holds of `tokens` (in the order of the engines now,
    /// kept in the decision) in the request's namespace, with the decision's figures.
    pub fn query(
        &self,
        tokens: Option<&[u32]>,
        lora: &str,
        salt: &str,
    ) -> (Vec<Matched>, Decision) {
        let prompt_len = tokens.map_or(0, |t| t.len() as u64);
        let rows = match tokens {
            Some(t) if !t.is_empty() => self.indexer.query_tokens(
                &QueryScope {
                    tenant: &self.config.tenant,
                    model: &self.config.model,
                    lora: LoraNs::Name(lora.to_owned()),
                    block_size: self.config.block_size,
                    salt,
                    instance: None,
                },
                t,
            ),
            _ => Default::default(),
        };
        let engines = self.engines();
        let matched: Vec<Matched> = engines
            .iter()
            .map(|e| {
                rows.get(&e.spec.instance)
                    .map_or(Matched::default(), |r| Matched {
                        gpu: r.gpu,
                        cpu: r.cpu,
                        disk: r.disk,
                        longest: r.longest_matched,
                    })
            })
            .collect();
        let reusable = score::reusable(prompt_len, prompt_len, self.config.block_size);
        let hashes = match tokens {
            Some(t) if self.shared.is_some() && self.config.share_blocks => {
                // The namespace in the seed: a request of another LoRA or salt shares none.
                let ns: Vec<u32> = lora
                    .bytes()
                    .chain([0])
                    .chain(salt.bytes())
                    .map(u32::from)
                    .collect();
                let seed = crate::indexer::hash::local_hash(&ns, self.config.hash_seed);
                crate::indexer::hash::seq_hashes(t, self.config.block_size as usize, seed)
            }
            _ => Vec::new(),
        };
        let predicted = matched
            .iter()
            .map(|m| score::reusable(m.longest, prompt_len, self.config.block_size))
            .collect();
        (
            matched,
            Decision {
                engines,
                tokens: tokens.map(<[u32]>::len),
                predicted,
                reusable,
                hashes,
            },
        )
    }

    /// Chooses one of `engines` for a prompt of `prompt_len` tokens matched as `matched` (not
    /// one in `skip`) and takes its reservation, as one step: the load scored is this replica's
    /// plus the other replicas' reservations, an engine whose slots are all held is not
    /// chosen, and a shared reservation is written only if nobody wrote that engine's entry
    /// since it was read (else the decision is made again, at most [`ROUTE_ATTEMPTS`] times).
    /// With NATS unreachable, the reservation is local only (counted).
    ///
    /// # Errors
    /// [`NoRoute`]: none up, all full, or too contended.
    pub async fn route(
        &self,
        decision: &Decision,
        matched: &[Matched],
        prompt_len: u64,
        draw: f64,
        skip: &[usize],
        session: Option<&str>,
    ) -> Result<(usize, Reservation), NoRoute> {
        let routed = self
            .route_once(decision, matched, prompt_len, draw, skip, session)
            .await;
        if let (Some(id), Ok((_, reservation))) = (session, &routed) {
            let now = std::time::Instant::now();
            let instance = &reservation.engine.spec.instance;
            let mut sessions = self.sessions.lock();
            let outcome = match sessions.engine(id, now) {
                None => "new",
                Some(e) if e == instance => "kept",
                Some(_) => "moved",
            };
            if sessions.note(id, instance, now) == super::model::sessions::Noted::Full {
                self.metrics
                    .limits_hit
                    .with_label_values(&["sessions"])
                    .inc();
            }
            self.metrics.sessions.with_label_values(&[outcome]).inc();
        }
        routed
    }

    async fn route_once(
        &self,
        decision: &Decision,
        matched: &[Matched],
        prompt_len: u64,
        draw: f64,
        skip: &[usize],
        session: Option<&str>,
    ) -> Result<(usize, Reservation), NoRoute> {
        let (engines, hashes) = (&decision.engines, &decision.hashes);
        let bs = u64::from(self.config.block_size);
        let sticky = session.and_then(|id| {
            let sessions = self.sessions.lock();
            let instance = sessions.engine(id, std::time::Instant::now())?;
            engines.iter().position(|e| e.spec.instance == instance)
        });
        let _turn = match &self.shared {
            Some(s) => Some(s.route_lock.lock().await),
            None => None,
        };
        let mut refused: Vec<usize> = Vec::new();
        for _ in 0..ROUTE_ATTEMPTS {
            let now = crate::cluster::now_ms();
            let mut full = false;
            let candidates: Vec<Candidate> = engines
                .iter()
                .enumerate()
                .map(|(i, e)| {
                    let mut load = e.load();
                    let mut matched = matched.get(i).copied().unwrap_or_default();
                    let held = match &self.shared {
                        Some(s) => {
                            // Another replica's request counts as one still waiting for its
                            // first byte (when answers start is not shared).
                            let others = s.others(&e.spec.instance, now);
                            load.in_flight += others;
                            load.waiting += others;
                            // The blocks a reserved request will add count as held there.
                            let pending = u64::from(s.pending(&e.spec.instance, now, hashes)) * bs;
                            if pending > matched.longest {
                                matched.gpu = matched.gpu.max(pending);
                                matched.longest = pending;
                            }
                            s.live(&e.spec.instance, now).max(load.in_flight)
                        }
                        None => load.in_flight,
                    };
                    let is_full = refused.contains(&i) || e.slots.is_some_and(|s| held >= s);
                    let up = e.is_up() && !skip.contains(&i);
                    full |= up && is_full;
                    Candidate {
                        matched,
                        load,
                        up: up && !is_full,
                        sticky: sticky == Some(i),
                    }
                })
                .collect();
            // Replicas sharing blocks break a tie alike for one prompt (by its first block), so
            // two routing it at once pick the same engine and one write meets the other's.
            let turn = match hashes.first() {
                Some(h) => *h as usize,
                None => self.rotate.fetch_add(1, Ordering::Relaxed),
            };
            let rotate = turn % candidates.len().max(1);
            let Some(i) =
                score::choose(&candidates, prompt_len, &self.config.weights, rotate, draw)
            else {
                return Err(if full { NoRoute::Full } else { NoRoute::NoneUp });
            };
            let engine = Arc::clone(&engines[i]);
            let Some(shared) = &self.shared else {
                match Reservation::try_new(engine, engines[i].slots) {
                    Some(r) => return Ok((i, r)),
                    None => continue,
                }
            };
            let blocks = super::model::slots::sample(hashes);
            match shared
                .reserve(&engine.spec.instance, engine.slots, blocks)
                .await
            {
                Ok(id) => {
                    let mut r = Reservation::new(engine);
                    r.shared = Some((Arc::clone(shared), id));
                    return Ok((i, r));
                }
                Err(Miss::Conflict) => {}
                Err(Miss::Full(_)) => refused.push(i),
                Err(Miss::Unreachable(e)) => {
                    tracing::warn!("shared reservation not written ({e}); reserved locally only");
                    if let Some(r) = Reservation::try_new(engine, engines[i].slots) {
                        return Ok((i, r));
                    }
                    refused.push(i);
                }
            }
        }
        Err(NoRoute::Contended)
    }

    /// Accounts an answer's `usage` against the decision (`engine`: its index in the
    /// decision's engines).
    pub fn account(&self, engine: usize, decision: &Decision, usage: &Value) {
        let Some(e) = decision.engines.get(engine) else {
            return;
        };
        let name = &e.spec.instance;
        if let (Some(mine), Some(theirs)) = (
            decision.tokens,
            usage.get("prompt_tokens").and_then(Value::as_u64),
        ) {
            if mine as u64 != theirs {
                self.metrics
                    .prompt_mismatch
                    .with_label_values(&[name])
                    .inc();
            }
        }
        let delivered = usage
            .get("prompt_tokens_details")
            .and_then(|d| d.get("cached_tokens"))
            .and_then(Value::as_u64);
        match (delivered, decision.tokens) {
            (Some(d), Some(_)) => self
                .accounting
                .lock()
                .record(name, &decision.delivery(engine, d)),
            _ => self.metrics.usage_missing.with_label_values(&[name]).inc(),
        }
    }
}

/// The part of a completion's `prompt` the router routes on.
enum PromptInput {
    Text(String),
    Ids(Vec<u32>),
    Chat,
}

/// A string, token ids, or the first of a batch of either.
fn first_prompt(v: &Value) -> Option<PromptInput> {
    match v {
        Value::String(s) => Some(PromptInput::Text(s.clone())),
        Value::Array(items) => match items.first()? {
            Value::Number(_) => items
                .iter()
                .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
                .collect::<Option<Vec<u32>>>()
                .map(PromptInput::Ids),
            first => first_prompt(first),
        },
        _ => None,
    }
}
