//! Private pools: CUDA graphs' memory pools and `torch.cuda.MemPool`.
//!
//! Design note: in PyTorch every private pool has its own small and large block sets, and a
//! block of one pool never serves a request of another (section 4.4 of the spec). Here a
//! private pool's blocks sit in the same ordered sets as the default pool's, under a
//! *virtual stream*: the set's key is (stream, size, address) and the search asks for one
//! stream only, so a block filed under the virtual stream of (pool, real stream) can serve
//! exactly the requests routed to that pool on that stream, as in PyTorch. This keeps the
//! default path as it was (no pool lookup, no second set per pool, the block still one cache
//! line) and costs one predictable branch in `malloc` while no pool is being allocated to.
//!
//! Virtual streams carry the top bit, which no real stream has (a CUDA stream is a pointer;
//! replay's simulated streams use bit 62). Everything that reports a stream (snapshots, the
//! history, OOM events, `record_stream`'s own-stream test, synchronising before an unmap)
//! translates back to the real stream here.
//!
//! A pool lives while its users hold it (`use_count`: a graph, a `MemPool` object). When the
//! last user releases it, it becomes freeable: `empty_cache` then returns its whole free
//! segments, after the default pool's, and forgets the pool once it owns no segment.

use std::collections::HashMap;

use crate::device::Device;
use crate::event::{PoolKind, StreamId};
use crate::oom::AllocError;
use crate::policy::{Allocation, State};

/// PyTorch's `MempoolId_t`: `(0, 0)` is the default pool; graphs' own pools are `(n, 0)`,
/// user pools (`graph_pool_handle()`, `MemPool()`) are `(0, n)`.
pub type MempoolId = (u64, u64);

/// The default pool's id.
pub const DEFAULT_POOL: MempoolId = (0, 0);

const VIRTUAL: StreamId = 1 << 63;

/// Whether `s` is a private pool's virtual stream.
#[inline(always)]
pub fn is_virtual(s: StreamId) -> bool {
    s & VIRTUAL != 0
}

#[derive(Debug)]
struct Pool {
    id: MempoolId,
    use_count: u32,
}

/// The private pools of one device, and where requests go while allocating to one.
#[derive(Debug, Default)]
pub(crate) struct PrivatePools {
    /// Slots; `None` once a freeable pool has given back its last segment.
    pools: Vec<Option<Pool>>,
    by_id: HashMap<MempoolId, usize>,
    to_virtual: HashMap<(usize, StreamId), StreamId>,
    /// virtual stream → (slot, real stream)
    to_real: HashMap<StreamId, (usize, StreamId)>,
    next_virtual: u64,
    /// `beginAllocateToPool` contexts, newest last: (slot, only this stream or any).
    routes: Vec<(usize, Option<StreamId>)>,
}

impl PrivatePools {
    /// Any pool was ever made (so streams may need translating).
    #[inline(always)]
    pub fn any(&self) -> bool {
        !self.by_id.is_empty()
    }

    /// Requests may be routed to a pool right now.
    #[inline(always)]
    pub fn routing(&self) -> bool {
        !self.routes.is_empty()
    }

    /// `createOrIncrefPool`.
    pub fn create_or_incref(&mut self, id: MempoolId) -> usize {
        if let Some(&slot) = self.by_id.get(&id) {
            if let Some(p) = self.pools[slot].as_mut() {
                p.use_count += 1;
            }
            return slot;
        }
        let pool = Some(Pool { id, use_count: 1 });
        let slot = match self.pools.iter().position(Option::is_none) {
            Some(s) => {
                self.pools[s] = pool;
                s
            }
            None => {
                self.pools.push(pool);
                self.pools.len() - 1
            }
        };
        self.by_id.insert(id, slot);
        slot
    }

    /// `releasePool`: one user fewer. Returns whether the pool is now freeable.
    pub fn release(&mut self, id: MempoolId) -> bool {
        let Some(&slot) = self.by_id.get(&id) else {
            return false;
        };
        match self.pools[slot].as_mut() {
            Some(p) => {
                p.use_count = p.use_count.saturating_sub(1);
                p.use_count == 0
            }
            None => false,
        }
    }

    pub fn slot(&self, id: MempoolId) -> Option<usize> {
        self.by_id.get(&id).copied()
    }

    pub fn begin_route(&mut self, slot: usize, stream: Option<StreamId>) {
        self.routes.push((slot, stream));
    }

    /// `endAllocateToPool`: drop the newest context of that pool.
    pub fn end_route(&mut self, slot: usize) {
        if let Some(i) = self.routes.iter().rposition(|r| r.0 == slot) {
            self.routes.remove(i);
        }
    }

    /// The key stream of a request on `stream`: a routed pool's virtual stream (newest
    /// context first, as PyTorch searches them), or the stream itself.
    pub fn route(&mut self, stream: StreamId) -> StreamId {
        let hit = self
            .routes
            .iter()
            .rev()
            .find(|(_, only)| only.is_none_or(|s| s == stream))
            .map(|r| r.0);
        match hit {
            Some(slot) => self.virtual_stream(slot, stream),
            None => stream,
        }
    }

    /// The virtual stream of (`slot`, `stream`), made on first use.
    pub fn virtual_stream(&mut self, slot: usize, stream: StreamId) -> StreamId {
        if let Some(&v) = self.to_virtual.get(&(slot, stream)) {
            return v;
        }
        let v = VIRTUAL | self.next_virtual;
        self.next_virtual += 1;
        self.to_virtual.insert((slot, stream), v);
        self.to_real.insert(v, (slot, stream));
        v
    }

    /// The real stream behind a key stream.
    #[inline]
    pub fn real(&self, s: StreamId) -> StreamId {
        if is_virtual(s) {
            self.to_real.get(&s).map_or(s, |r| r.1)
        } else {
            s
        }
    }

    /// The pool slot of a key stream (None: the default pool).
    pub fn slot_of(&self, s: StreamId) -> Option<usize> {
        if is_virtual(s) {
            self.to_real.get(&s).map(|r| r.0)
        } else {
            None
        }
    }

    /// The `MempoolId` of a key stream.
    pub fn id_of(&self, s: StreamId) -> MempoolId {
        self.slot_of(s)
            .and_then(|slot| self.pools.get(slot)?.as_ref())
            .map_or(DEFAULT_POOL, |p| p.id)
    }

    /// Slots whose users are all gone, oldest slot first.
    pub fn freeable(&self) -> Vec<usize> {
        (0..self.pools.len())
            .filter(|&i| self.pools[i].as_ref().is_some_and(|p| p.use_count == 0))
            .collect()
    }

    /// A freeable pool owns no segment any more: forget it and its streams.
    pub fn delete(&mut self, slot: usize) {
        let Some(p) = self.pools.get_mut(slot).and_then(Option::take) else {
            return;
        };
        self.by_id.remove(&p.id);
        self.to_virtual.retain(|&(s, _), v| {
            let keep = s != slot;
            if !keep {
                self.to_real.remove(v);
            }
            keep
        });
    }
}

impl<D: Device> State<D> {
    /// `createOrIncrefPool`: a graph or a `MemPool` starts using pool `id`.
    pub fn create_or_incref_pool(&mut self, id: MempoolId) {
        self.private.create_or_incref(id);
    }

    /// `releasePool`: a user of pool `id` is gone (a graph was destroyed). Its memory goes
    /// back at the next `empty_cache` once no user is left.
    pub fn release_pool(&mut self, id: MempoolId) {
        self.private.release(id);
    }

    /// `beginAllocateToPool`: requests on `stream` (or on any stream, for `None`) go to pool
    /// `id` until [`end_allocate_to_pool`](Self::end_allocate_to_pool).
    pub fn begin_allocate_to_pool(&mut self, id: MempoolId, stream: Option<StreamId>) {
        let slot = match self.private.slot(id) {
            Some(s) => s,
            None => self.private.create_or_incref(id),
        };
        self.private.begin_route(slot, stream);
    }

    pub fn end_allocate_to_pool(&mut self, id: MempoolId) {
        if let Some(slot) = self.private.slot(id) {
            self.private.end_route(slot);
        }
    }

    /// A request that goes to pool `id` (made on first use) whatever the routing: how a
    /// replay re-issues a recorded request whose pool it knows. Events are processed first,
    /// as outside a capture.
    pub fn malloc_in_pool(
        &mut self,
        n: u64,
        stream: StreamId,
        id: MempoolId,
    ) -> Result<Allocation, AllocError> {
        if id == DEFAULT_POOL {
            return self.malloc(n, stream, None);
        }
        if n >= crate::policy::ONE_EB || n == 0 {
            return self.malloc(n, stream, None);
        }
        self.process_events();
        let slot = match self.private.slot(id) {
            Some(s) => s,
            None => self.private.create_or_incref(id),
        };
        let key = self.private.virtual_stream(slot, stream);
        self.malloc_keyed(n, key, None)
    }

    /// Free bytes cached in private pools: the "allocated in private pools" of PyTorch's OOM
    /// message.
    pub(crate) fn private_free_cached_bytes(&self) -> u64 {
        if !self.private.any() {
            return 0;
        }
        [PoolKind::Small, PoolKind::Large]
            .iter()
            .flat_map(|&k| self.pool_ref(k).blocks.to_vec(&self.arena))
            .map(|id| self.arena.get(id))
            .filter(|b| is_virtual(b.stream))
            .map(|b| b.size)
            .sum()
    }

    /// After the default pool's release in `empty_cache`: every freeable private pool gives
    /// back its whole free segments, and is forgotten once it owns none.
    pub(crate) fn release_freeable_pools(&mut self) {
        for slot in self.private.freeable() {
            self.release_pool_blocks(PoolKind::Large, Some(slot));
            self.release_pool_blocks(PoolKind::Small, Some(slot));
            let owns = self
                .arena
                .live_ids()
                .any(|id| self.private.slot_of(self.arena.get(id).stream) == Some(slot));
            if !owns {
                self.private.delete(slot);
            }
        }
    }

    /// Whether block stream `s` belongs to `pool` (None: the default pool).
    pub(crate) fn in_pool(&self, s: StreamId, pool: Option<usize>) -> bool {
        match pool {
            None => !is_virtual(s),
            Some(slot) => self.private.slot_of(s) == Some(slot),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_only_the_captured_stream_newest_first() {
        let mut p = PrivatePools::default();
        let a = p.create_or_incref((1, 0));
        let b = p.create_or_incref((0, 1));
        assert_eq!(p.route(7), 7, "no context: the stream itself");
        p.begin_route(a, Some(7));
        let va = p.route(7);
        assert!(is_virtual(va));
        assert_eq!(p.route(8), 8, "another stream is not captured");
        p.begin_route(b, None);
        let vb = p.route(7);
        assert_ne!(va, vb, "the newest context wins");
        assert_eq!(p.id_of(vb), (0, 1));
        assert_eq!(p.real(vb), 7);
        p.end_route(b);
        assert_eq!(p.route(7), va);
        p.end_route(a);
        assert_eq!(p.route(7), 7);
    }

    #[test]
    fn a_pool_is_freeable_when_its_last_user_goes() {
        let mut p = PrivatePools::default();
        let s = p.create_or_incref((1, 0));
        assert_eq!(p.create_or_incref((1, 0)), s);
        assert!(!p.release((1, 0)));
        assert!(p.release((1, 0)));
        assert_eq!(p.freeable(), vec![s]);
        let v = p.virtual_stream(s, 3);
        p.delete(s);
        assert_eq!(p.slot((1, 0)), None);
        assert_eq!(p.real(v), v, "forgotten");
        assert!(p.freeable().is_empty());
    }
}
