//! The index against a naive model of the same semantics: per stream a map of engine hash →
//! (namespace, sequence hash, per-tier references), and a query that scans every map for
//! every block. Random stores (chains split across events, branches, LoRA and salt
//! namespaces, token-less offload stores, engine hashes reused for other content), removals,
//! clears and re-registrations; after each, every probe prompt in every namespace must get
//! the same answer from both. This is what checks the arena-order walk (a query following
//! chains instead of looking every block up).

use super::tests::{spec, BS};
use super::*;
use crate::indexer::model::events::{Lora, Removed, Stored};
use proptest::prelude::*;
use std::collections::HashMap;

/// Prompts as block symbols; block `x` is tokens `x*BS .. x*BS+BS`. They share prefixes.
const PROMPTS: [&[u32]; 5] = [
    &[1, 2, 3, 4, 5, 6, 7, 8],
    &[1, 2, 3, 9, 10, 11],
    &[1, 2, 12, 13],
    &[14, 15, 16, 17, 18, 19],
    &[1, 20],
];

fn block_tokens(syms: &[u32]) -> Vec<u32> {
    syms.iter().flat_map(|x| x * BS..x * BS + BS).collect()
}

/// The engine's hash of a prompt's first `i + 1` blocks (the same on every stream, as
/// vLLM's). An engine reusing a hash for other content is modelled by storing a prompt's
/// blocks under another prompt's hashes (`Op::Store`'s `alt`).
fn engine(prompt: usize, i: usize) -> u64 {
    PROMPTS[prompt][..=i]
        .iter()
        .fold(0x51u64, |h, x| super::super::table::mix(h ^ u64::from(*x)))
}

/// [`engine`] of a prompt's block `at`, or of its last block when `at` is past its end.
fn engine_at(prompt: usize, at: usize) -> u64 {
    engine(prompt, at.min(PROMPTS[prompt].len() - 1))
}

const NAMESPACES: [(&str, &str); 3] = [("", ""), ("sql", ""), ("", "cust")];

#[derive(Clone, Debug)]
enum Op {
    Store {
        stream: usize,
        prompt: usize,
        from: usize,
        len: usize,
        tier: usize,
        ns: usize,
        /// The engine hashes are another prompt's (same positions).
        alt: Option<usize>,
    },
    Placeholder {
        stream: usize,
        prompt: usize,
        at: usize,
        tier: usize,
    },
    Remove {
        stream: usize,
        prompt: usize,
        at: usize,
        tier: usize,
    },
    Clear {
        stream: usize,
        tier: Option<usize>,
    },
    Reregister {
        stream: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..4usize, 0..5usize, 0..8usize, 1..8usize, 0..3usize, 0..3usize,
              proptest::option::weighted(0.1, 0..5usize))
            .prop_map(|(stream, prompt, from, len, tier, ns, alt)| Op::Store {
                stream, prompt, from, len, tier, ns, alt
            }),
        1 => (0..4usize, 0..5usize, 0..8usize, 1..3usize)
            .prop_map(|(stream, prompt, at, tier)| Op::Placeholder { stream, prompt, at, tier }),
        4 => (0..4usize, 0..5usize, 0..8usize, 0..3usize)
            .prop_map(|(stream, prompt, at, tier)| Op::Remove { stream, prompt, at, tier }),
        1 => (0..4usize, proptest::option::of(0..3usize))
            .prop_map(|(stream, tier)| Op::Clear { stream, tier }),
        1 => (0..4usize).prop_map(|stream| Op::Reregister { stream }),
    ]
}

/// One stream's blocks: engine hash → (namespace, seq, per-tier references).
type StreamMap = HashMap<u64, (usize, u64, [u8; 3])>;

/// The naive index.
#[derive(Default)]
struct NaiveIndex {
    maps: Vec<StreamMap>,
}

impl NaiveIndex {
    fn store(&mut self, st: usize, engine: u64, ns: usize, seq: u64, tier: usize) {
        let map = &mut self.maps[st];
        if map.get(&engine).is_some_and(|e| (e.0, e.1) != (ns, seq)) {
            map.remove(&engine);
        }
        let e = map.entry(engine).or_insert((ns, seq, [0; 3]));
        let cap = if tier == 0 {
            1
        } else {
            super::super::table::MAX_OFFLOAD_REFS
        };
        e.2[tier] = (e.2[tier] + 1).min(cap);
    }

    fn remove(&mut self, st: usize, engine: u64, tier: usize) {
        let map = &mut self.maps[st];
        if let Some(e) = map.get_mut(&engine) {
            e.2[tier] = e.2[tier].saturating_sub(1);
            if e.2 == [0; 3] {
                map.remove(&engine);
            }
        }
    }

    fn mask(&self, st: usize, ns: usize, seq: u64) -> u8 {
        self.maps[st]
            .values()
            .filter(|e| (e.0, e.1) == (ns, seq))
            .fold(0, |m, e| {
                m | (0..3).fold(0, |a, t| a | u8::from(e.2[t] > 0) << t)
            })
    }

    /// The spec's walk, by brute force: per rank, the longest prefix each block of which the
    /// rank or its instance's shared pool holds (per tier: holds on that tier).
    fn query(
        &self,
        specs: &[StreamSpec],
        ns: usize,
        seqs: &[u64],
    ) -> BTreeMap<String, InstanceMatch> {
        let mut out: BTreeMap<String, InstanceMatch> = BTreeMap::new();
        for (st, sp) in specs.iter().enumerate() {
            if sp.shared {
                continue;
            }
            let pools: Vec<usize> = (0..specs.len())
                .filter(|&p| specs[p].shared && specs[p].instance == sp.instance)
                .collect();
            let masks: Vec<u8> = seqs
                .iter()
                .map(|&seq| {
                    pools
                        .iter()
                        .fold(self.mask(st, ns, seq), |m, &p| m | self.mask(p, ns, seq))
                })
                .collect();
            let run = |f: &dyn Fn(u8) -> bool| {
                masks.iter().take_while(|m| f(**m)).count() as u64 * u64::from(BS)
            };
            let m = out.entry(sp.instance.clone()).or_default();
            m.gpu = m.gpu.max(run(&|x| x & 1 != 0));
            m.cpu = m.cpu.max(run(&|x| x & 2 != 0));
            m.disk = m.disk.max(run(&|x| x & 4 != 0));
            let len = run(&|x| x != 0);
            let dp = m.dp.entry(sp.dp_rank).or_default();
            *dp = (*dp).max(len);
            m.longest_matched = m.longest_matched.max(len);
        }
        out
    }
}

fn specs() -> Vec<StreamSpec> {
    vec![
        spec("a", 0),
        spec("a", 1),
        spec("b", 0),
        StreamSpec {
            shared: true,
            ..spec("a", 0)
        },
    ]
}

fn scope_of(ns: usize) -> QueryScope<'static> {
    QueryScope {
        lora: LoraNs::Name(NAMESPACES[ns].0.into()),
        salt: NAMESPACES[ns].1,
        ..super::tests::scope()
    }
}

fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let specs = specs();
    let mut index = Index::new(IndexConfig::default());
    let mut ids: Vec<StreamId> = specs
        .iter()
        .map(|s| index.add_stream(s.clone()).expect("a stream"))
        .collect();
    let mut model = NaiveIndex {
        maps: vec![HashMap::new(); specs.len()],
    };
    let seed = index.config().seed;
    let seqs_of = |p: usize| hash::seq_hashes(&block_tokens(PROMPTS[p]), BS as usize, seed);
    for op in ops {
        match *op {
            Op::Store {
                stream,
                prompt,
                from,
                len,
                tier,
                ns,
                alt,
            } => {
                let syms = PROMPTS[prompt];
                let from = from.min(syms.len() - 1);
                let to = (from + len).min(syms.len());
                let seqs = seqs_of(prompt);
                let hash_of = |i: usize| match alt {
                    Some(a) if i < PROMPTS[a].len() => engine(a, i),
                    _ => engine(prompt, i),
                };
                let (lora, salt) = NAMESPACES[ns];
                let ev = Stored {
                    hashes: (from..to).map(hash_of).collect(),
                    parent: (from > 0).then(|| hash_of(from - 1)),
                    tokens: block_tokens(&syms[from..to]),
                    block_size: BS,
                    lora: if lora.is_empty() {
                        Lora::Unspecified
                    } else {
                        Lora::Name(lora.into())
                    },
                    cache_salt: (!salt.is_empty()).then(|| salt.into()),
                    medium: Medium::ALL[tier],
                    ..Stored::default()
                };
                // The model: the namespace and chain come from the parent when there is one.
                let ns_seq = if from == 0 {
                    Some((ns, None))
                } else {
                    model.maps[stream]
                        .get(&hash_of(from - 1))
                        .map(|e| (e.0, Some(e.1)))
                };
                if let Some((ns, mut parent)) = ns_seq {
                    for i in from..to {
                        let seq = hash::next_seq_hash(parent, &block_tokens(&syms[i..=i]), seed);
                        parent = Some(seq);
                        model.store(stream, hash_of(i), ns, seq, tier);
                    }
                    // A chain stored from the prompt's start has the prompt's own hashes.
                    if from == 0 && ns == 0 {
                        prop_assert_eq!(parent, Some(seqs[to - 1]));
                    }
                }
                index.apply(ids[stream], &KvEvent::Stored(ev), 0);
            }
            Op::Placeholder {
                stream,
                prompt,
                at,
                tier,
            } => {
                let h = engine_at(prompt, at);
                if let Some(&(ns, seq, _)) = model.maps[stream].get(&h) {
                    model.store(stream, h, ns, seq, tier);
                }
                let ev = Stored {
                    hashes: vec![h],
                    medium: Medium::ALL[tier],
                    ..Stored::default()
                };
                index.apply(ids[stream], &KvEvent::Stored(ev), 0);
            }
            Op::Remove {
                stream,
                prompt,
                at,
                tier,
            } => {
                let h = engine_at(prompt, at);
                model.remove(stream, h, tier);
                let ev = KvEvent::Removed(Removed {
                    hashes: vec![h],
                    medium: Medium::ALL[tier],
                    group: None,
                });
                index.apply(ids[stream], &ev, 0);
            }
            Op::Clear { stream, tier } => {
                let map = &mut model.maps[stream];
                match tier {
                    None => map.clear(),
                    Some(t) => {
                        map.values_mut().for_each(|e| e.2[t] = 0);
                        map.retain(|_, e| e.2 != [0; 3]);
                    }
                }
                index.apply(
                    ids[stream],
                    &KvEvent::Cleared(tier.map(|t| Medium::ALL[t])),
                    0,
                );
            }
            Op::Reregister { stream } => {
                model.maps[stream].clear();
                index.remove_stream(ids[stream]);
                ids[stream] = index.add_stream(specs[stream].clone()).expect("a stream");
            }
        }
        // Streams re-registered get new ids in `ids`; the model keeps positions.
        for p in 0..PROMPTS.len() {
            let seqs = seqs_of(p);
            for ns in 0..NAMESPACES.len() {
                let got = index.query_hashes(&scope_of(ns), &seqs);
                let want = model.query(&specs, ns, &seqs);
                prop_assert_eq!(got, want, "prompt {} namespace {} after {:?}", p, ns, op);
            }
        }
        let records: usize = model.maps.iter().map(HashMap::len).sum();
        prop_assert_eq!(index.records(), records);
    }
    for id in ids {
        index.remove_stream(id);
    }
    prop_assert_eq!(index.memberships(), 0);
    prop_assert_eq!(index.records(), 0);
    prop_assert_eq!(index.namespaces(), 0, "namespaces go with their last block");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]
    #[test]
    fn queries_answer_as_a_naive_index_does(ops in proptest::collection::vec(op(), 1..60)) {
        run(&ops)?;
    }
}
