//! The coordinator's pure state: no I/O, no clock (`now` is passed in), no task. What the
//! owners in [`crate::coordinator::state`] hold and change.
//!
//! - `objkey` — object keys: the wire form and the compact one.
//! - `keys` — tracked L2 keys and their copies per holder and backend: compact 56-byte
//!   slots, per-salt usage and LRU lists.
//! - `holders` — the servers (live or departed) and the fleet holding copies; backends.
//! - [`fleet`] — registered MP servers, heartbeats, the timeout sweep.
//! - [`events`] — the two usage-event bodies (documented `POST /quota/events`, 0.5.6
//!   `POST /events`) and the per-instance sequence gate.
//! - `usage` — bytes per instance and compartment against declared capacities.
//! - [`pins`] — token sequences to object keys (BLAKE3 chunk hashes, `chunk_hash`), and the
//!   pin table.
//! - `metadata` — the operator-set state (quotas, the default quota, pins) as one document.
//! - `directory` — the key directory (0.5.6's `/directory/*`): placements per holder,
//!   access counts, token ids once per chunk; `blend` its CacheBlend content index;
//!   [`tokens`] the store events' token ids as batches carry them.
//!
//! [`Model`]: the coordinator's key state as one plain struct with plain methods: event gate, tracked
//! keys, quotas, pins and the counters behind the metrics. Fleet membership is not here: it
//! is the [`Instances`](fleet::Instances), owned by its own small task so that heartbeats
//! never wait behind this model's work.
//!
//! No I/O and no clock (the wall-clock time of a departure is passed in): the eviction
//! decision (`eviction.rs`) is returned as victim keys per holding server and backend, which
//! the driver sends to those servers ([`dispatches`]). One task owns a
//! [`Model`]; nothing else touches it. Event batches are admitted whole and applied in
//! slices of at most [`SLICE_OPS`] events ([`Model::admit`], [`Model::apply_slice`]), so the
//! owner answers other requests between the slices of a large request.

pub(crate) mod blend;
pub(crate) mod chunk_hash;
pub(crate) mod directory;
pub mod events;
pub mod fleet;
pub(crate) mod holders;
pub(crate) mod keys;
pub(crate) mod metadata;
pub(crate) mod objkey;
pub mod pins;
pub mod tokens;
pub(crate) mod usage;

use directory::DirectoryConfig;
use events::{Admit, Batch, Gate, Op, Tier};
use fleet::Instance;
use holders::FLEET;
use keys::{EncodedKey, KeyError, KeyStore, Limits, Untracked};
use pins::Pins;
use serde::Serialize;
use std::collections::BTreeMap;
use usage::{FleetStatus, InstanceStatus, Module, Usage};

/// Bytes in one GiB (quota limits are given in GiB).
pub const GIB: f64 = (1u64 << 30) as f64;
/// Most keys in one eviction `DELETE /cache/objects` call (LMCache's chunking).
pub const MAX_KEYS_PER_DISPATCH: usize = 10_000;
/// Most victims planned in one cycle over all salts (the rest wait for the next cycle), so a
/// cycle's memory and outbound work are bounded whatever the number of tracked keys.
pub const MAX_VICTIMS_PER_CYCLE: usize = 10 * MAX_KEYS_PER_DISPATCH;
/// Most events applied in one step of the owner ([`Model::apply_slice`]).
pub const SLICE_OPS: usize = 4_096;
/// Eviction cycles a planned key stays out of later plans (its delete in flight: the
/// server's delete events normally come back within a second), unless its dispatch failed.
pub const IN_FLIGHT_CYCLES: u64 = 2;

/// Limits and eviction settings of the model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// Most event cursors (one per registered instance).
    pub max_instances: usize,
    /// Most tracked keys over all salts.
    pub max_tracked_keys: usize,
    /// Most explicit quotas.
    pub max_quotas: usize,
    /// Fraction of a salt's keys evicted per cycle when over its quota (0..=1).
    pub eviction_ratio: f64,
    /// Evict when usage ≥ watermark × quota ((0, 1]).
    pub trigger_watermark: f64,
}

/// Counters the driver exports as metrics. Monotonic unless said otherwise.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Counters {
    /// Batches applied.
    pub batches_applied: u64,
    /// Batches dropped as duplicates.
    pub batches_duplicate: u64,
    /// Batches dropped as stale (older incarnation).
    pub batches_stale: u64,
    /// Batches dropped because the cursor table was full.
    pub batches_refused: u64,
    /// Sequence numbers skipped (sum of gaps).
    pub seq_gaps: u64,
    /// Events applied (store, access, delete on the L2 tier).
    pub events_applied: u64,
    /// Events of the L1 tier (counted per instance for `/instances/usage`, not for quotas).
    pub events_l1_ignored: u64,
    /// `config` batches (capacity declarations) applied.
    pub capacity_declarations: u64,
    /// Events with a key that cannot be tracked.
    pub keys_rejected: u64,
    /// New keys dropped at the tracked-key limit.
    pub keys_refused: u64,
    /// Keys planned for eviction.
    pub eviction_keys_planned: u64,
    /// Cycles that hit [`MAX_VICTIMS_PER_CYCLE`] (more victims wait for the next cycle).
    pub eviction_cycles_capped: u64,
    /// Placements not tracked: another copy of a key past the placement limit, or the
    /// holder or backend table full (a key's first placement at the key limit is
    /// `keys_refused`).
    #[serde(default)]
    pub placements_refused: u64,
    /// Planned copies on a shared backend with no live member to send them to.
    #[serde(default)]
    pub eviction_copies_unreachable: u64,
    /// Placements dropped because their holder left more than
    /// [`crate::config::defaults::coordinator::DEPARTED_L2_TTL_S`] ago.
    #[serde(default)]
    pub placements_expired: u64,
}

/// Why a quota cannot be set.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuotaError {
    /// Negative, NaN, infinite or larger than 2^63 bytes.
    #[error("limit_gb must be a finite number >= 0 and below 2^33 GiB")]
    InvalidLimit,
    /// The salt can never match a key.
    #[error("cache_salt must be at most 128 characters without '@', '/', '\\' or NUL")]
    InvalidSalt,
    /// Too many quotas.
    #[error("quota limit of {0} salts reached")]
    Full(usize),
}

/// A limit in GiB as bytes, truncated like LMCache (`int(limit_gb * 2**30)`).
fn limit_bytes(limit_gb: f64) -> Result<u64, QuotaError> {
    // Below 2^33 GiB (2^63 bytes), as the document's `exclusiveMaximum` says.
    let bytes = limit_gb * GIB;
    if !(limit_gb.is_finite() && (0.0..8_589_934_592.0).contains(&limit_gb)) {
        return Err(QuotaError::InvalidLimit);
    }
    // finite, ≥ 0, < 2^63
    Ok(bytes as u64)
}

/// A salt's quota and usage (`GET /quota/{cache_salt}`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct QuotaStatus {
    /// The salt ("" for `_default`).
    pub cache_salt: String,
    /// The explicit limit in GiB (0.0 without one, as 0.5.6 answers).
    pub quota_limit_gb: f64,
    /// Whether an explicit quota exists.
    pub quota_exists: bool,
    /// Tracked L2 bytes in GiB.
    pub usage_gb: f64,
    /// The limit eviction applies, in GiB: the explicit quota, else the default quota;
    /// `None` when the salt is exempt (no quota and a `null` default). kvplane's addition
    /// (0.5.6 shows only the explicit quota, Q17).
    pub effective_limit_gb: Option<f64>,
    /// Where [`QuotaStatus::effective_limit_gb`] comes from: `"quota"`, `"default"` or
    /// `"exempt"`.
    pub limit_source: &'static str,
}

/// What one ingest call did (`POST /events` reply counts batches).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Ingested {
    /// Batches applied.
    pub applied: u64,
    /// Batches dropped as duplicates.
    pub duplicates: u64,
    /// Batches dropped as stale (or refused at the cursor limit).
    pub stale: u64,
    /// Events processed in applied batches (the documented `recorded`).
    #[serde(skip)]
    pub recorded: u64,
}

/// A [`Model`] in a snapshot: everything but its configuration (the restoring process's own).
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct ModelDump {
    /// Event cursors `(instance, incarnation, last seq)`.
    pub cursors: Vec<(String, u64, u64)>,
    /// Tracked keys in LRU order.
    pub keys: keys::KeysDump,
    /// Quotas, default quota and pins (`saved_at` 0).
    pub metadata: metadata::Metadata,
    /// Bytes per instance and compartment, declarations, L1 placements.
    pub usage: usage::UsageDump,
    /// The metrics' counters.
    pub counters: Counters,
    /// The key directory (placements, access counts, token ids).
    #[serde(default)]
    pub directory: directory::DirectoryDump,
}

/// The coordinator state.
pub struct Model {
    config: ModelConfig,
    gate: Gate,
    keys: KeyStore,
    /// Explicit quotas in bytes.
    quotas: BTreeMap<String, u64>,
    /// The limit of a salt without a quota (`PUT /quota/config`); `None` exempts such salts
    /// from eviction. Starts at `None`, as in 0.5.6 (`--default-quota-gb` seeds it).
    default_limit: Option<u64>,
    /// Keys pinned against eviction (`/cache/pins`).
    pub pins: Pins,
    /// Bytes per instance and compartment, and declared capacities.
    pub usage: Usage,
    /// Counters for the metrics.
    pub counters: Counters,
    /// Keys (by slot) planned for eviction, with the cycle that planned them: not planned
    /// again for [`IN_FLIGHT_CYCLES`] (Q7). The leader's own: not logged, not in snapshots.
    in_flight: hashbrown::HashMap<u32, u64>,
    /// Eviction cycles planned.
    cycle: u64,
    /// The key directory (`/directory/*`), fed by the same admitted batches.
    pub directory: directory::Directory,
}

impl Model {
    /// An empty model.
    pub fn new(config: ModelConfig) -> Self {
        Model {
            gate: Gate::new(config.max_instances),
            keys: KeyStore::new(max_holders(&config)),
            quotas: BTreeMap::new(),
            default_limit: None,
            pins: Pins::default(),
            usage: Usage::new(
                config.max_instances.saturating_mul(2).saturating_add(1),
                config.max_tracked_keys / 4,
            ),
            counters: Counters::default(),
            in_flight: hashbrown::HashMap::new(),
            cycle: 0,
            directory: directory::Directory::new(directory_config(&config)),
            config,
        }
    }

    fn limits(&self) -> Limits {
        Limits {
            keys: self.config.max_tracked_keys,
            extra_placements: self.config.max_tracked_keys,
        }
    }

    /// The content for a snapshot ([`ModelDump`]).
    pub fn dump(&self) -> ModelDump {
        ModelDump {
            cursors: self.gate.dump(),
            keys: self.keys.dump(),
            metadata: self.capture_metadata(0.0),
            usage: self.usage.dump(),
            counters: self.counters.clone(),
            directory: self.directory.dump(),
        }
    }

    /// A model of `config` holding `dump`.
    ///
    /// # Errors
    /// When `config`'s key limit cannot hold the dump's keys, or a key does not fit.
    pub fn restore(config: ModelConfig, dump: ModelDump) -> Result<Self, String> {
        let mut model = Model::new(config);
        model.gate = Gate::restore(model.config.max_instances, dump.cursors);
        model.keys = KeyStore::restore(dump.keys, model.limits(), max_holders(&model.config))?;
        model.restore_metadata(
            dump.metadata,
            crate::config::defaults::coordinator::MAX_PINNED_KEYS,
        );
        model.usage = Usage::restore(
            model
                .config
                .max_instances
                .saturating_mul(2)
                .saturating_add(1),
            model.config.max_tracked_keys / 4,
            dump.usage,
        );
        model.counters = dump.counters;
        model.directory =
            directory::Directory::restore(directory_config(&model.config), dump.directory);
        Ok(model)
    }

    /// The limits and eviction settings, read-only.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Keys tracked.
    pub fn tracked_keys(&self) -> usize {
        self.keys.len()
    }

    /// Bytes allocated for tracked keys (with their placements and the holder tables).
    pub fn tracked_key_memory(&self) -> usize {
        self.keys.memory_bytes()
    }

    /// L2 placements tracked (copies of keys, per holder and backend).
    pub fn tracked_placements(&self) -> usize {
        self.keys.placement_count()
    }

    /// Holders of tracked L2 copies (servers, departed ones included, and the fleet).
    pub fn l2_holders(&self) -> usize {
        self.keys.holders.len()
    }

    /// An instance left at `now` (`DELETE /instances/{id}` or the sweep; wall-clock
    /// seconds): forgets its event cursor, its declared capacities and its L1 bytes. Its
    /// private L2 copies stay but stop counting in any salt's usage (no server can evict
    /// them) until it sends events again or they expire ([`Model::expire_departed`]).
    pub fn forget_instance(&mut self, id: &str, now: f64) {
        self.gate.forget(id);
        self.usage.forget(id);
        self.keys.depart(id, now);
        self.directory.fence(id);
    }

    /// Drops the private L2 copies of servers that left at or before `cutoff` (wall-clock
    /// seconds) and did not come back; their bytes leave `/instances/usage` too. One pass over
    /// the tracked keys, only when some server's time is up; returns the instances expired.
    pub fn expire_departed(&mut self, cutoff: f64) -> Vec<String> {
        let dropped = self.keys.expire(cutoff);
        let mut ids: Vec<String> = Vec::new();
        for (id, backend, bytes) in dropped {
            let n = i64::try_from(bytes).unwrap_or(i64::MAX);
            self.usage.adjust(&id, Tier::L2, &backend, -n);
            self.counters.placements_expired += 1;
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        ids
    }

    /// Whether some server left at or before `cutoff` still has copies to expire.
    pub fn has_departed_before(&self, cutoff: f64) -> bool {
        !self.keys.holders.departed_before(cutoff).is_empty()
    }

    /// `GET /instances/{id}/usage` (`None`: unknown).
    pub fn instance_usage(&self, id: &str, registered: bool) -> Option<InstanceStatus> {
        self.usage.instance(id, registered)
    }

    /// `GET /instances/usage` for the currently registered ids.
    pub fn fleet_usage(&self, registered: Vec<String>) -> FleetStatus {
        self.usage.fleet(registered)
    }

    /// `PUT /quota/config`: the limit of salts without a quota, in GiB (`None`: exempt).
    ///
    /// # Errors
    /// [`QuotaError::InvalidLimit`] for a negative, non-finite or too large limit.
    pub fn set_default_limit(&mut self, limit_gb: Option<f64>) -> Result<(), QuotaError> {
        self.default_limit = match limit_gb {
            None => None,
            Some(gb) => Some(limit_bytes(gb)?),
        };
        Ok(())
    }

    /// `GET /quota/config`: the limit of salts without a quota, in GiB (`None`: exempt).
    pub fn default_limit_gb(&self) -> Option<f64> {
        self.default_limit.map(|b| b as f64 / GIB)
    }

    /// `PUT /quota/{cache_salt}`.
    ///
    /// # Errors
    /// [`QuotaError`] for a bad limit or salt, or at the quota limit.
    pub fn set_quota(&mut self, salt: &str, limit_gb: f64) -> Result<(), QuotaError> {
        let bytes = limit_bytes(limit_gb)?;
        if salt.chars().count() > 128 || salt.contains(['@', '/', '\\', '\0']) {
            return Err(QuotaError::InvalidSalt);
        }
        if !self.quotas.contains_key(salt) && self.quotas.len() >= self.config.max_quotas {
            return Err(QuotaError::Full(self.config.max_quotas));
        }
        self.quotas.insert(salt.to_owned(), bytes);
        Ok(())
    }

    /// The operator-set state for `--metadata-path`: quotas, default quota, pins.
    pub fn capture_metadata(&self, wall_now: f64) -> metadata::Metadata {
        metadata::Metadata {
            version: metadata::VERSION,
            saved_at: wall_now,
            quotas: self.quotas.clone(),
            default_limit_bytes: self.default_limit,
            pins: self
                .pins
                .rows()
                .into_iter()
                .map(|(key, pin_count)| metadata::PinRow { key, pin_count })
                .collect(),
        }
    }

    /// Loads a saved document at startup: quotas (within the limits; a bad salt or one over
    /// the quota limit is skipped), the default quota and pins (at most `max_pins` keys).
    /// Returns how many quotas and pinned keys were restored.
    pub fn restore_metadata(&mut self, doc: metadata::Metadata, max_pins: usize) -> (usize, usize) {
        let mut quotas = 0;
        for (salt, bytes) in doc.quotas {
            let ok_salt = salt.len() <= 128 && !salt.contains(['@', '/', '\\', '\0']);
            if ok_salt && bytes < (1u64 << 63) && self.quotas.len() < self.config.max_quotas {
                self.quotas.insert(salt, bytes);
                quotas += 1;
            }
        }
        self.default_limit = doc.default_limit_bytes.filter(|&b| b < (1u64 << 63));
        let pins = doc
            .pins
            .iter()
            .filter(|row| self.pins.restore(&row.key, row.pin_count, max_pins))
            .count();
        (quotas, pins)
    }

    /// Forgets every quota, the default quota and every pin (back to a new model's), before
    /// a standby applies its leader's whole operator state.
    pub fn clear_metadata(&mut self) {
        self.quotas.clear();
        self.default_limit = None;
        self.pins = Pins::default();
    }

    /// `POST /cache/delete`: each key followed by its tracked copies in other object groups
    /// (ascending group), as 0.5.6 expands a token-addressed delete; at most `max` keys in all
    /// (the requested keys always stay).
    pub fn expand_object_groups(&self, keys: Vec<EncodedKey>, max: usize) -> Vec<EncodedKey> {
        let mut out = Vec::with_capacity(keys.len());
        let mut room = max.saturating_sub(keys.len());
        for key in keys {
            let others = if room > 0 {
                self.keys.in_other_groups(&key)
            } else {
                Vec::new()
            };
            let mut all: Vec<EncodedKey> = others.into_iter().take(room).collect();
            room -= all.len();
            all.push(key);
            all.sort_by_key(|k| k.object_group_id);
            out.extend(all);
        }
        out
    }

    /// `DELETE /quota/{cache_salt}`: true if a quota existed.
    pub fn remove_quota(&mut self, salt: &str) -> bool {
        self.quotas.remove(salt).is_some()
    }

    /// `GET /quota/{cache_salt}` (never fails: an unknown salt has no quota and no usage).
    pub fn quota_status(&self, salt: &str) -> QuotaStatus {
        let limit = self.quotas.get(salt).copied();
        let (effective, source) = match (limit, self.default_limit) {
            (Some(b), _) => (Some(b), "quota"),
            (None, Some(b)) => (Some(b), "default"),
            (None, None) => (None, "exempt"),
        };
        QuotaStatus {
            cache_salt: salt.to_owned(),
            quota_limit_gb: limit.map_or(0.0, |b| b as f64 / GIB),
            quota_exists: limit.is_some(),
            usage_gb: self.keys.salt_bytes(salt) as f64 / GIB,
            effective_limit_gb: effective.map(|b| b as f64 / GIB),
            limit_source: source,
        }
    }

    /// `GET /quota`: total usage in GiB and every salt with a quota or usage, by salt.
    pub fn quota_list(&self) -> (f64, Vec<QuotaStatus>) {
        let mut salts: Vec<&str> = self.quotas.keys().map(String::as_str).collect();
        salts.extend(self.keys.salts().map(|(s, _)| s));
        salts.sort_unstable();
        salts.dedup();
        let total: u64 = self.keys.salts().map(|(_, b)| b).sum();
        (
            total as f64 / GIB,
            salts.into_iter().map(|s| self.quota_status(s)).collect(),
        )
    }

    /// Admits and applies batches in order (what [`Model::admit`] then
    /// [`Model::apply_slice`] on each slice do).
    pub fn ingest(&mut self, batches: impl IntoIterator<Item = Batch>) -> Ingested {
        let (out, slices) = self.admit(batches);
        for b in slices {
            self.apply_slice(b);
        }
        out
    }

    /// Passes batches through the sequence gate (the cursors move now) and returns the
    /// admitted ones cut into slices of at most [`SLICE_OPS`] events, in the order they must
    /// be applied. Applying nothing of them is like a lost request: the sender's next
    /// batch is a gap.
    pub fn admit(&mut self, batches: impl IntoIterator<Item = Batch>) -> (Ingested, Vec<Batch>) {
        let mut out = Ingested::default();
        let mut slices = Vec::new();
        for b in batches {
            let before = self.gate.incarnation(&b.instance_id);
            match self.gate.admit(&b.instance_id, b.incarnation, b.seq) {
                Admit::Duplicate => {
                    out.duplicates += 1;
                    self.counters.batches_duplicate += 1;
                    continue;
                }
                Admit::Stale => {
                    out.stale += 1;
                    self.counters.batches_stale += 1;
                    continue;
                }
                Admit::Full => {
                    out.stale += 1;
                    self.counters.batches_refused += 1;
                    continue;
                }
                // A sender may jump its sequence by up to 2^64: the count saturates.
                Admit::Gap { missing } => {
                    self.counters.seq_gaps = self.counters.seq_gaps.saturating_add(missing);
                }
                Admit::InOrder => {}
            }
            if before.is_some_and(|inc| inc < b.incarnation) {
                // A restarted server: what it held in memory is gone. Its L2 copies are
                // keyed by instance id, not incarnation: a re-store updates them.
                self.usage.fence_l1(&b.instance_id);
                self.directory.fence(&b.instance_id);
            }
            // A server that left and talks again: its L2 copies count again.
            self.keys.revive(&b.instance_id);
            out.applied += 1;
            out.recorded += b.ops.len() as u64;
            self.counters.batches_applied += 1;
            slice_in_apply_order(b, &mut slices);
        }
        (out, slices)
    }

    /// Applies one slice from [`Model::admit`], its events in the order given.
    pub fn apply_slice(&mut self, b: Batch) {
        self.directory.apply(&b);
        let owner = if b.shared { "" } else { b.instance_id.as_str() };
        if b.shared && b.tier == Tier::L2 {
            self.keys.holders.note_shared(&b.instance_id, &b.backend);
        }
        if let Some((capacity_bytes, revision)) = b.capacity {
            self.counters.capacity_declarations += 1;
            let module = Module {
                tier: b.tier,
                backend: b.backend.clone(),
                capacity_bytes,
                shared: b.shared,
            };
            self.usage
                .declare(&b.instance_id, (b.incarnation, revision), module);
            return;
        }
        if b.tier == Tier::L1 {
            self.counters.events_l1_ignored += b.ops.len() as u64;
            for op in &b.ops {
                match op {
                    Op::Store(key, size) => self.usage.l1_store(owner, &b.backend, key, *size),
                    Op::Delete(key) => self.usage.l1_delete(owner, &b.backend, key),
                    // A hit in L1 refreshes the key's L2 recency too (0.5.6 ignores it, Q3).
                    Op::Access(key) => self.touch(key),
                }
            }
            return;
        }
        for op in b.ops {
            match self.apply_op(op, owner, &b.backend) {
                Ok(()) => self.counters.events_applied += 1,
                Err(_) => self.counters.keys_rejected += 1,
            }
        }
    }

    /// Marks a tracked key most recently used (an untracked or bad key is ignored).
    fn touch(&mut self, key: &EncodedKey) {
        if let Ok(Some(k)) = self.keys.find_compact(key) {
            self.keys.touch(&key.cache_salt, &k);
        }
    }

    /// Records `owner`'s copy (`""`: the fleet's shared one) of a key in `backend`; the bytes
    /// it moves are also counted for the owner's compartment. Refusals are counted.
    fn place(
        &mut self,
        key: &EncodedKey,
        owner: &str,
        backend: &str,
        size: u64,
    ) -> Result<(), KeyError> {
        let size = u32::try_from(size).map_err(|_| KeyError::OutOfRange("size_bytes"))?;
        let k = self.keys.compact(key)?;
        let holder = if owner.is_empty() {
            Some(FLEET)
        } else {
            self.keys.holders.intern(owner)
        };
        let (Some(holder), Some(b)) = (holder, self.keys.holders.backend(backend)) else {
            self.counters.placements_refused += 1;
            return Ok(());
        };
        let limits = self.limits();
        match self.keys.store(&key.cache_salt, k, holder, b, size, limits) {
            Ok(delta) => {
                self.usage.adjust(owner, Tier::L2, backend, delta);
            }
            Err(Untracked::Keys) => self.counters.keys_refused += 1,
            Err(Untracked::Placements) => self.counters.placements_refused += 1,
        }
        Ok(())
    }

    /// One L2 event of `owner` (`""`: a shared backend) in `backend`.
    fn apply_op(&mut self, op: Op, owner: &str, backend: &str) -> Result<(), KeyError> {
        match op {
            Op::Store(key, size) => self.place(&key, owner, backend, size)?,
            Op::Access(key) => {
                self.keys.find_compact(&key)?;
                self.touch(&key);
            }
            Op::Delete(key) => {
                let Some(k) = self.keys.find_compact(&key)? else {
                    return Ok(());
                };
                let holder = self.keys.holders.find(owner);
                let b = self.keys.holders.backends.get_index_of(backend);
                let (Some(holder), Some(b)) = (holder, b.and_then(|b| u8::try_from(b).ok())) else {
                    return Ok(());
                };
                if let Some(size) = self.keys.delete(&key.cache_salt, &k, holder, b) {
                    self.usage
                        .adjust(owner, Tier::L2, backend, -i64::from(size));
                }
            }
        }
        Ok(())
    }

    /// Startup resync: records the copies that `instance_id`'s listing of `backend` shows
    /// (`shared`: the fleet's), except those events already reported (events are fresher).
    /// Returns how many were added.
    pub fn seed(
        &mut self,
        instance_id: &str,
        backend: &str,
        shared: bool,
        entries: Vec<(EncodedKey, u64)>,
    ) -> u64 {
        let owner = if shared { "" } else { instance_id };
        if shared {
            self.keys.holders.note_shared(instance_id, backend);
        }
        let mut added = 0;
        for (key, size) in entries {
            let known = match self.keys.find_compact(&key) {
                Ok(Some(k)) => self.keys.contains(&key.cache_salt, &k),
                Ok(None) => false,
                Err(_) => {
                    self.counters.keys_rejected += 1;
                    continue;
                }
            };
            if known {
                continue;
            }
            let before = self.keys.placement_count();
            match self.place(&key, owner, backend, size) {
                Ok(()) if self.keys.placement_count() > before => added += 1,
                Ok(()) => {}
                Err(_) => self.counters.keys_rejected += 1,
            }
        }
        added
    }
}

/// Cuts an admitted batch into slices of at most [`SLICE_OPS`] events, appended to `out` in
/// application order. A batch of stores holds a sequence's chunks prefix first; recording
/// them in reverse makes the prefix the most recently used, so eviction takes the tail of a
/// sequence first (a suffix without its prefix is unreachable; LMCache quirk Q2).
fn slice_in_apply_order(b: Batch, out: &mut Vec<Batch>) {
    let Batch {
        instance_id,
        incarnation,
        seq,
        tier,
        backend,
        shared,
        capacity,
        mut ops,
        tokens,
    } = b;
    if ops.iter().all(|op| matches!(op, Op::Store(..))) {
        ops.reverse();
    }
    let slice = |ops: Vec<Op>| Batch {
        tokens: events::for_ops(&tokens, &ops),
        instance_id: instance_id.clone(),
        incarnation,
        seq,
        tier,
        backend: backend.clone(),
        shared,
        capacity,
        ops,
    };
    if ops.len() <= SLICE_OPS {
        out.push(slice(ops));
        return;
    }
    let mut rest = ops.into_iter().peekable();
    while rest.peek().is_some() {
        out.push(slice(rest.by_ref().take(SLICE_OPS).collect()));
    }
}

/// Most holders of L2 copies: every instance twice (registered and departed) and the fleet.
fn max_holders(config: &ModelConfig) -> usize {
    config.max_instances.saturating_mul(2).saturating_add(1)
}

mod eviction;
pub use eviction::{dispatches, Dispatch, Victims};

/// The directory's limits for a model of `m`: as many keys as the model tracks, names for
/// four times the instance limit (restarted servers with fresh ids), blend off.
fn directory_config(m: &ModelConfig) -> DirectoryConfig {
    DirectoryConfig {
        max_keys: m.max_tracked_keys,
        max_token_ids: directory::MAX_TOKEN_IDS,
        max_names: m.max_instances.saturating_mul(4).saturating_add(64),
        blend: None,
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod placements_tests;
