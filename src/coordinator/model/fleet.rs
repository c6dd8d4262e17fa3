//! Fleet membership: the registered MP servers, their heartbeats and the timeout sweep.
//!
//! Pure: the caller passes `now` (a monotonic instant) and the wall-clock registration time.
//! Owns nothing but the instance table and its two counters. It has its own small owner task
//! ([`crate::coordinator::state::driver`]), apart from the key model's, so a heartbeat never waits behind event
//! ingest; the driver tells the model ([`crate::coordinator::model`]) to drop the event cursors of the
//! instances [`Instances::sweep`] and [`Instances::remove`] take out.

use indexmap::IndexMap;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// A registration request (`POST /instances`), already validated.
#[derive(Clone, Debug, PartialEq, serde::Deserialize, Serialize)]
pub struct Registration {
    /// Requested id; `None` (omitted or blank) means generate one.
    pub instance_id: Option<String>,
    /// Host the coordinator dials (non-empty).
    pub ip: String,
    /// Port of the server's HTTP API (1..=65535).
    pub http_port: u16,
    /// Free-form registration hints.
    pub metadata: BTreeMap<String, String>,
    /// P2P URL, empty when P2P is off.
    pub p2p_advertised_url: String,
    /// P2P message-queue port, 0 when P2P is off.
    pub mq_port: u16,
}

/// One registered MP server, as `GET /instances` lists it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Instance {
    /// Its id.
    pub instance_id: String,
    /// Host of its HTTP API.
    pub ip: String,
    /// Port of its HTTP API.
    pub http_port: u16,
    /// Wall-clock registration time, epoch seconds.
    pub registration_time: f64,
    /// Registration hints.
    pub metadata: BTreeMap<String, String>,
    /// P2P URL.
    pub p2p_advertised_url: String,
    /// P2P message-queue port.
    pub mq_port: u16,
    /// Last heartbeat (or registration), monotonic.
    #[serde(skip)]
    pub last_seen: Instant,
}

/// An [`Instances`] in a snapshot: each instance's registration (id set) and registration time,
/// in registration order, and the counters. Heartbeat instants are not kept: a restored
/// instance counts as seen at the restore (as at a takeover).
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct InstancesDump {
    instances: Vec<(Registration, f64)>,
    refused: u64,
    timed_out: u64,
}

/// Why a registration was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FleetError {
    /// The instance limit is reached (a re-registration is always accepted).
    #[error("instance limit of {0} reached")]
    Full(usize),
}

/// The registered instances, in registration order.
#[derive(Debug, Default)]
pub struct Instances {
    instances: IndexMap<String, Instance>,
    max_instances: usize,
    /// Registrations refused at the instance limit (monotonic).
    pub refused: u64,
    /// Instances removed by the timeout sweep (monotonic).
    pub timed_out: u64,
}

impl Instances {
    /// An empty fleet holding at most `max_instances`.
    pub fn new(max_instances: usize) -> Self {
        Instances {
            instances: IndexMap::new(),
            max_instances,
            refused: 0,
            timed_out: 0,
        }
    }

    /// The content for a snapshot ([`InstancesDump`]).
    pub fn dump(&self) -> InstancesDump {
        let instances = self
            .instances
            .values()
            .map(|i| {
                let registration = Registration {
                    instance_id: Some(i.instance_id.clone()),
                    ip: i.ip.clone(),
                    http_port: i.http_port,
                    metadata: i.metadata.clone(),
                    p2p_advertised_url: i.p2p_advertised_url.clone(),
                    mq_port: i.mq_port,
                };
                (registration, i.registration_time)
            })
            .collect();
        InstancesDump {
            instances,
            refused: self.refused,
            timed_out: self.timed_out,
        }
    }

    /// A fleet of at most `max_instances` holding `dump`, every instance seen at `now`.
    ///
    /// # Errors
    /// [`FleetError::Full`] when it holds more instances than `max_instances`.
    pub fn restore(
        max_instances: usize,
        dump: InstancesDump,
        now: Instant,
    ) -> Result<Self, FleetError> {
        let mut fleet = Instances::new(max_instances);
        for (registration, at) in dump.instances {
            fleet.register(registration, String::new, now, at)?;
        }
        fleet.refused = dump.refused;
        fleet.timed_out = dump.timed_out;
        Ok(fleet)
    }

    /// Registers or re-registers. `generated_id` is used when the request has no id.
    /// Returns the id and whether it replaced a registration (its slot in the order is kept).
    ///
    /// # Errors
    /// [`FleetError::Full`] for a new id when the limit is reached.
    pub fn register(
        &mut self,
        req: Registration,
        generated_id: impl FnOnce() -> String,
        now: Instant,
        wall_now: f64,
    ) -> Result<(String, bool), FleetError> {
        let id = req.instance_id.unwrap_or_else(generated_id);
        let existed = self.instances.contains_key(&id);
        if !existed && self.instances.len() >= self.max_instances {
            self.refused += 1;
            return Err(FleetError::Full(self.max_instances));
        }
        let inst = Instance {
            instance_id: id.clone(),
            ip: req.ip,
            http_port: req.http_port,
            registration_time: wall_now,
            metadata: req.metadata,
            p2p_advertised_url: req.p2p_advertised_url,
            mq_port: req.mq_port,
            last_seen: now,
        };
        self.instances.insert(id.clone(), inst);
        Ok((id, existed))
    }

    /// Records a heartbeat; false for an unknown id (the server must re-register).
    pub fn heartbeat(&mut self, id: &str, now: Instant) -> bool {
        match self.instances.get_mut(id) {
            Some(inst) => {
                inst.last_seen = now;
                true
            }
            None => false,
        }
    }

    /// Deregisters; true if it was registered.
    pub fn remove(&mut self, id: &str) -> bool {
        self.instances.shift_remove(id).is_some()
    }

    /// Removes every instance silent for more than `timeout`; returns their ids
    /// ([`Instances::expired`], then [`Instances::time_out`]).
    pub fn sweep(&mut self, now: Instant, timeout: Duration) -> Vec<String> {
        let gone = self.expired(now, timeout);
        self.time_out(&gone);
        gone
    }

    /// The ids of the instances silent for more than `timeout`, in registration order.
    pub fn expired(&self, now: Instant, timeout: Duration) -> Vec<String> {
        self.instances
            .values()
            .filter(|i| now.saturating_duration_since(i.last_seen) > timeout)
            .map(|i| i.instance_id.clone())
            .collect()
    }

    /// Removes `ids` as timed out (counted; the others keep their order). A standby applies
    /// the leader's sweep outcome with this.
    pub fn time_out(&mut self, ids: &[String]) {
        if ids.is_empty() {
            return;
        }
        let gone: std::collections::HashSet<&str> = ids.iter().map(String::as_str).collect();
        let before = self.instances.len();
        self.instances.retain(|id, _| !gone.contains(id.as_str()));
        self.timed_out += (before - self.instances.len()) as u64;
    }

    /// Every instance counts as seen at `now` (a new coordinator leader: nobody is removed
    /// for the silence of a failover).
    pub fn touch_all(&mut self, now: Instant) {
        for inst in self.instances.values_mut() {
            inst.last_seen = now;
        }
    }

    /// One instance.
    pub fn get(&self, id: &str) -> Option<&Instance> {
        self.instances.get(id)
    }

    /// Every instance, in registration order.
    pub fn iter(&self) -> impl Iterator<Item = &Instance> {
        self.instances.values()
    }

    /// The `n`-th instance modulo the fleet size (a uniform pick given a uniform `n`).
    pub fn pick(&self, n: u64) -> Option<&Instance> {
        let len = u64::try_from(self.instances.len())
            .ok()
            .filter(|&l| l > 0)?;
        let i = usize::try_from(n % len).ok()?;
        self.instances.get_index(i).map(|(_, v)| v)
    }

    /// Registered instances.
    pub fn len(&self) -> usize {
        self.instances.len()
    }

    /// True when no instance is registered.
    pub fn is_empty(&self) -> bool {
        self.instances.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(id: Option<&str>, port: u16) -> Registration {
        Registration {
            instance_id: id.map(str::to_owned),
            ip: "127.0.0.1".into(),
            http_port: port,
            metadata: BTreeMap::new(),
            p2p_advertised_url: String::new(),
            mq_port: 0,
        }
    }

    #[test]
    fn register_generates_ids_and_reports_re_registration() {
        let t0 = Instant::now();
        let mut f = Instances::new(2);
        let (id, again) = f
            .register(reg(None, 1), || "mp-gen".into(), t0, 1.0)
            .unwrap();
        assert_eq!((id.as_str(), again), ("mp-gen", false));
        let (id, again) = f
            .register(reg(Some("a"), 2), || unreachable!(), t0, 2.0)
            .unwrap();
        assert_eq!((id.as_str(), again), ("a", false));
        // Full for a new id, still open to a re-registration, which keeps its slot.
        assert_eq!(
            f.register(reg(Some("b"), 3), String::new, t0, 3.0),
            Err(FleetError::Full(2))
        );
        let (_, again) = f
            .register(reg(Some("mp-gen"), 9), String::new, t0, 4.0)
            .unwrap();
        assert!(again);
        let ports: Vec<_> = f
            .iter()
            .map(|i| (i.instance_id.as_str(), i.http_port))
            .collect();
        assert_eq!(ports, [("mp-gen", 9), ("a", 2)]);
        assert_eq!(f.get("mp-gen").map(|i| i.registration_time), Some(4.0));
        assert_eq!(f.refused, 1);
    }

    #[test]
    fn heartbeat_remove_and_sweep() {
        let t0 = Instant::now();
        let timeout = Duration::from_secs(30);
        let mut f = Instances::new(10);
        f.register(reg(Some("a"), 1), String::new, t0, 0.0).unwrap();
        f.register(reg(Some("b"), 2), String::new, t0, 0.0).unwrap();
        assert!(!f.heartbeat("zz", t0));
        assert!(f.heartbeat("a", t0 + Duration::from_secs(20)));
        // Exactly at the timeout is still alive (LMCache's rule is a strict >).
        assert!(f.sweep(t0 + timeout, timeout).is_empty());
        assert_eq!(f.sweep(t0 + Duration::from_secs(31), timeout), ["b"]);
        assert_eq!(f.timed_out, 1);
        assert_eq!(f.len(), 1);
        assert!(f.remove("a"));
        assert!(!f.remove("a"));
        assert!(f.is_empty());
        assert!(f.pick(7).is_none());
    }

    #[test]
    fn pick_is_modulo_the_fleet() {
        let t0 = Instant::now();
        let mut f = Instances::new(10);
        for (id, p) in [("a", 1), ("b", 2), ("c", 3)] {
            f.register(reg(Some(id), p), String::new, t0, 0.0).unwrap();
        }
        let picked: Vec<_> = (0..6).map(|n| f.pick(n).unwrap().http_port).collect();
        assert_eq!(picked, [1, 2, 3, 1, 2, 3]);
    }
}
