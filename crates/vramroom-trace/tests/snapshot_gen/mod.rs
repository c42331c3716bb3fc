//! Snapshot-shaped pickles with hostile numbers, from any bytes: the generator behind the
//! `snapshot_replay` fuzz target (`fuzz/fuzz_targets/snapshot_replay.rs`, which includes
//! this file) and its stable stand-in, `tests/replay_semantic.rs`.
//!
//! Design note: byte-level fuzzing of the reader almost never gets past the schema, so
//! replay and the allocator behind it never see what a pickle can *say*. Here every input
//! becomes a well-formed protocol-4 pickle of a `_snapshot()` dict, and the input bytes
//! choose only its contents: sizes and addresses near 0, 2^63 and u64::MAX, negative
//! numbers where unsigned ones belong, events out of order and frees of addresses never
//! allocated, blocks that do not tile their segment, huge `max_split_size`, NaN
//! thresholds and long `PYTORCH_CUDA_ALLOC_CONF` strings, missing keys and `None`s, and
//! stacks shared through the memo as PyTorch shares them. Exhausted input reads as zeros,
//! so every prefix is valid too, which lets libFuzzer's minimizer work.

#![allow(dead_code)]

/// The fuzzer's bytes, read as choices.
pub struct Choices<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Choices<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Choices { data, pos: 0 }
    }

    pub fn byte(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    /// A number in `0..n` (n ≥ 1).
    pub fn below(&mut self, n: usize) -> usize {
        let v = if n > 256 {
            usize::from(u16::from_le_bytes([self.byte(), self.byte()]))
        } else {
            usize::from(self.byte())
        };
        v % n.max(1)
    }

    pub fn chance(&mut self, in_256: u8) -> bool {
        self.byte() < in_256
    }

    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(std::array::from_fn(|_| self.byte()))
    }

    /// Sizes and addresses an allocator must survive.
    pub fn number(&mut self, pool: &[u64]) -> u64 {
        let small = u64::from(self.byte());
        match self.below(14) {
            0 => 0,
            1 => small,
            2 => 512 * u64::from(u16::from_le_bytes([self.byte(), self.byte()])),
            3 => (1 << 20) * small,
            4 => 2 << 20,
            5 => 20 << 20,
            6 => u64::MAX - small,
            7 => (1 << 63) + small * 512,
            8 => (i64::MAX as u64) - small,
            9 => self.u64(),
            10 | 11 => match pool {
                [] => small << 21,
                _ => pool[self.below(pool.len())],
            },
            12 => match pool {
                [] => u64::MAX,
                _ => pool[self.below(pool.len())].wrapping_add(small * 512),
            },
            _ => (1 << 47) + (small << 21),
        }
    }

    /// Signed 64-bit numbers: the same, reinterpreted, plus small negative ones.
    pub fn signed(&mut self) -> i128 {
        let n = self.number(&[]);
        i128::from(match self.below(4) {
            0 => -((n % (1 << 40)) as i64),
            1 => i64::MIN + (n % 1024) as i64,
            _ => n as i64,
        })
    }
}

const ACTIONS: [&str; 10] = [
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "snapshot",
    "oom",
    "teleport",
];

/// A protocol-4 pickle writer for the subset below; memoizes only what it is told to.
struct Pickle {
    out: Vec<u8>,
    next_memo: u32,
}

impl Pickle {
    fn str(&mut self, s: &str) {
        if let Ok(n) = u8::try_from(s.len()) {
            self.out.extend([0x8c, n]);
        } else {
            self.out.push(b'X');
            self.out.extend((s.len() as u32).to_le_bytes());
        }
        self.out.extend(s.as_bytes());
    }
    fn int(&mut self, v: i128) {
        if let Ok(b) = u8::try_from(v) {
            self.out.extend([b'K', b]);
        } else if let Ok(i) = i32::try_from(v) {
            self.out.push(b'J');
            self.out.extend(i.to_le_bytes());
        } else {
            // LONG1, shortest two's complement, as CPython writes it
            let bytes = v.to_le_bytes();
            let mut n = 16;
            while n > 1 {
                let top = bytes[n - 1];
                let below = bytes[n - 2];
                if (top == 0 && below & 0x80 == 0) || (top == 0xff && below & 0x80 != 0) {
                    n -= 1;
                } else {
                    break;
                }
            }
            self.out.extend([0x8a, n as u8]);
            self.out.extend(&bytes[..n]);
        }
    }
    fn float(&mut self, f: f64) {
        self.out.push(b'G');
        self.out.extend(f.to_be_bytes());
    }
    fn bool(&mut self, b: bool) {
        self.out.push(if b { 0x88 } else { 0x89 });
    }
    fn none(&mut self) {
        self.out.push(b'N');
    }
    fn memoize(&mut self) -> u32 {
        self.out.push(0x94);
        self.next_memo += 1;
        self.next_memo - 1
    }
    fn get(&mut self, id: u32) {
        self.out.push(b'j');
        self.out.extend(id.to_le_bytes());
    }
    fn dict_start(&mut self) {
        self.out.extend([b'}', b'(']);
    }
    fn dict_end(&mut self) {
        self.out.push(b'u');
    }
    fn list_start(&mut self) {
        self.out.extend([b']', b'(']);
    }
    fn list_end(&mut self) {
        self.out.push(b'e');
    }
}

struct Gen<'c, 'a> {
    c: &'c mut Choices<'a>,
    p: Pickle,
    /// Addresses used so far, for frees and blocks that refer to them.
    addrs: Vec<u64>,
    /// Memo ids of stacks written so far, to share.
    stacks: Vec<u32>,
    /// Whether this pickle also breaks the schema (missing keys, `None`s, negative sizes,
    /// unknown actions): rarely, since one such value makes the reader refuse the whole
    /// snapshot and replay never runs.
    sloppy: bool,
}

impl Gen<'_, '_> {
    /// A key and a value, or (rarely) the key with `None`, or (rarely) nothing at all.
    fn field(&mut self, key: &str, value: impl FnOnce(&mut Self)) {
        match if self.sloppy { self.c.below(32) } else { 2 } {
            0 => {}
            1 => {
                self.p.str(key);
                self.p.none();
            }
            _ => {
                self.p.str(key);
                value(self);
            }
        }
    }

    fn unsigned(&mut self) {
        let n = if self.sloppy && self.c.chance(8) {
            -i128::from(self.c.byte()) - 1
        } else {
            i128::from(self.c.number(&self.addrs))
        };
        self.p.int(n);
    }

    fn address(&mut self) -> u64 {
        let a = self.c.number(&self.addrs);
        if self.addrs.len() < 64 {
            self.addrs.push(a);
        }
        a
    }

    fn stack(&mut self) {
        if !self.stacks.is_empty() && self.c.chance(160) {
            let id = self.stacks[self.c.below(self.stacks.len())];
            self.p.get(id);
            return;
        }
        self.p.out.push(b']');
        let id = self.p.memoize();
        self.stacks.push(id);
        let n = self.c.below(4);
        if n > 0 {
            self.p.out.push(b'(');
            for _ in 0..n {
                self.p.dict_start();
                self.p.str("name");
                self.p
                    .str(["forward", "<module>", "??", ""][self.c.below(4)]);
                self.p.str("filename");
                self.p.str("model.py");
                self.p.str("line");
                let line = match self.c.below(3) {
                    0 => i128::from(u64::MAX),
                    _ => i128::from(self.c.byte()),
                };
                self.p.int(line);
                self.p.dict_end();
            }
            self.p.list_end();
        }
    }

    fn block(&mut self, at: u64) {
        self.p.dict_start();
        self.field("address", |g| {
            let a = if g.c.chance(200) { at } else { g.address() };
            g.p.int(i128::from(a));
        });
        self.field("size", |g| g.unsigned());
        self.field("requested_size", |g| g.unsigned());
        self.field("state", |g| {
            let states = ["active_allocated", "active_pending_free", "inactive", "odd"];
            let n = if g.sloppy && g.c.chance(8) { 4 } else { 3 };
            let s = states[g.c.below(n)];
            g.p.str(s);
        });
        self.field("frames", |g| g.stack());
        self.p.dict_end();
    }

    fn segment(&mut self) {
        let address = self.address();
        let total = self.c.number(&[]);
        self.p.dict_start();
        self.field("device", |g| g.p.int(i128::from(g.c.byte() % 3)));
        self.field("address", |g| g.p.int(i128::from(address)));
        self.field("total_size", |g| g.p.int(i128::from(total)));
        for key in ["allocated_size", "active_size", "requested_size"] {
            self.field(key, |g| g.unsigned());
        }
        self.field("stream", |g| g.p.int(i128::from(g.c.number(&[]) % 4)));
        self.field("segment_type", |g| {
            let t = ["large", "small", "huge"][g.c.below(3)];
            g.p.str(t);
        });
        self.field("segment_pool_id", |g| {
            g.p.int(i128::from(g.c.byte() % 3));
            g.p.int(i128::from(g.c.byte() % 3));
            g.p.out.push(0x86);
        });
        self.field("is_expandable", |g| g.p.bool(g.c.chance(64)));
        self.field("frames", |g| g.stack());
        self.p.str("blocks");
        self.p.list_start();
        let mut at = address;
        for _ in 0..self.c.below(5) {
            self.block(at);
            at = at.wrapping_add(self.c.number(&[]));
        }
        self.p.list_end();
        self.p.dict_end();
    }

    fn entry(&mut self, time: &mut i64) {
        let n = if self.sloppy && self.c.chance(8) {
            10
        } else {
            9
        };
        let action = ACTIONS[self.c.below(n)];
        self.p.dict_start();
        self.p.str("action");
        self.p.str(action);
        let key = if action == "oom" {
            "device_free"
        } else {
            "addr"
        };
        self.field(key, |g| {
            let a = if action == "alloc" || action == "segment_alloc" || action == "segment_map" {
                g.address()
            } else {
                g.c.number(&g.addrs)
            };
            g.p.int(i128::from(a));
        });
        self.field("size", |g| g.unsigned());
        self.field("stream", |g| g.p.int(i128::from(g.c.number(&[]) % 3)));
        self.field("time_us", |g| {
            // mostly forward, sometimes back, sometimes anywhere
            *time = match g.c.below(8) {
                0 => time.wrapping_sub(i64::from(g.c.byte())),
                1 => g.c.signed() as i64,
                _ => time.wrapping_add(i64::from(g.c.byte())),
            };
            g.p.int(i128::from(*time));
        });
        self.field("compile_context", |g| g.p.str("N/A"));
        self.field("user_metadata", |g| g.p.str(""));
        if self.c.chance(128) {
            self.p.str("frames");
            self.stack();
        }
        self.p.dict_end();
    }

    fn conf(&mut self) -> String {
        let mut parts = Vec::new();
        for _ in 0..self.c.below(5) {
            let n = self.c.number(&[]);
            let part = match self.c.below(12) {
                0 => "expandable_segments:True".to_string(),
                1 => "expandable_segments:False".to_string(),
                2 => format!("max_split_size_mb:{}", n),
                3 => format!("max_split_size_mb:{}", n % 4096),
                4 => format!("garbage_collection_threshold:0.{}", self.c.byte()),
                5 => format!("roundup_power2_divisions:{}", 1u64 << (self.c.byte() % 12)),
                6 => "roundup_power2_divisions:[256:1,512:2,>:4]".to_string(),
                7 => "backend:native".to_string(),
                8 => format!(
                    "pinned_num_register_threads:{}",
                    1u64 << (self.c.byte() % 9)
                ),
                9 => "release_lock_on_cudamalloc:True".to_string(),
                10 => format!("max_non_split_rounding_mb:{}", n % 100_000),
                _ => String::from_utf8_lossy(&[self.c.byte(), self.c.byte(), b':', self.c.byte()])
                    .into_owned(),
            };
            parts.push(part);
        }
        let mut conf = parts.join(",");
        if self.c.chance(16) {
            // long: thousands of repeated settings
            conf = std::iter::repeat_n(conf.as_str(), 1 + self.c.below(4000))
                .collect::<Vec<_>>()
                .join(",");
        }
        conf
    }

    fn settings(&mut self) {
        self.p.dict_start();
        self.field("PYTORCH_CUDA_ALLOC_CONF", |g| {
            let conf = g.conf();
            g.p.str(&conf);
        });
        self.field("max_split_size", |g| {
            let v = match g.c.below(4) {
                0 => -1,
                1 => i128::from(g.c.number(&[]) as i64),
                _ => i128::from(g.c.number(&[]) % (1 << 40)),
            };
            g.p.int(v);
        });
        self.field("garbage_collection_threshold", |g| {
            let f = [0.0, 0.5, 0.99, 1.0, -1.0, f64::NAN, f64::INFINITY, 1e300][g.c.below(8)];
            g.p.float(f);
        });
        self.field("expandable_segments", |g| g.p.bool(g.c.chance(100)));
        self.field("pinned_num_register_threads", |g| {
            let v = if g.c.chance(200) { 1 } else { g.c.signed() };
            g.p.int(v);
        });
        for key in [
            "release_lock_on_cudamalloc",
            "pinned_use_cuda_host_register",
            "graph_capture_record_stream_reuse",
        ] {
            self.field(key, |g| g.p.bool(g.c.chance(64)));
        }
        self.field("roundup_power2_divisions", |g| {
            g.p.dict_start();
            for i in 0..16 {
                if g.c.chance(240) {
                    g.p.str(&(1u64 << i).to_string());
                    let v = match g.c.below(6) {
                        0 => g.c.signed(),
                        1 => i128::from(1u64 << (g.c.byte() % 63)),
                        _ => i128::from(1u64 << (g.c.byte() % 5)),
                    };
                    g.p.int(v);
                }
            }
            g.p.dict_end();
        });
        self.p.dict_end();
    }
}

/// The pickle that `data` describes.
pub fn pickle(data: &[u8]) -> Vec<u8> {
    let mut c = Choices::new(data);
    let mut g = Gen {
        c: &mut c,
        p: Pickle {
            out: vec![0x80, 4],
            next_memo: 0,
        },
        addrs: Vec::new(),
        stacks: Vec::new(),
        sloppy: false,
    };
    g.sloppy = g.c.chance(32);
    g.p.dict_start();
    g.p.str("segments");
    g.p.list_start();
    for _ in 0..g.c.below(5) {
        g.segment();
    }
    g.p.list_end();
    g.p.str("device_traces");
    g.p.list_start();
    for _ in 0..1 + g.c.below(2) {
        g.p.list_start();
        let mut time = (1i64 << 50) + i64::from(g.c.byte());
        for _ in 0..g.c.below(200) {
            g.entry(&mut time);
        }
        g.p.list_end();
    }
    g.p.list_end();
    g.field("allocator_settings", |g| g.settings());
    g.field("external_annotations", |g| {
        g.p.list_start();
        for _ in 0..g.c.below(3) {
            g.p.dict_start();
            g.p.str("stage");
            g.p.str("START");
            g.p.str("name");
            g.p.str("region");
            g.p.str("device");
            g.p.int(0);
            g.p.str("time_us");
            g.p.int(g.c.signed());
            g.p.dict_end();
        }
        g.p.list_end();
    });
    g.p.dict_end();
    g.p.out.push(b'.');
    g.p.out
}

/// Replay settings that `data` chooses: a small simulated capacity (1 MiB to 64 GiB), and
/// whether to stop at the first OOM and to record history.
pub fn replay_choices(data: &[u8]) -> (u64, bool, bool) {
    let tail = data.iter().rev().copied().chain(std::iter::repeat(0));
    let [a, b]: [u8; 2] = {
        let mut t = tail;
        [t.next().unwrap_or(0), t.next().unwrap_or(0)]
    };
    (1u64 << (20 + a % 17), b & 1 == 0, b & 2 != 0)
}
