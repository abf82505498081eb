//! Collectives on CPU tensors over TCP, for ranks launched with the environment convention
//! (`--rendezvous env`): a ring of sockets, each rank sending to the next and receiving from the
//! previous one.
//!
//! Why a ring of our own and not c10d's `ProcessGroupGloo`: libtorch ships Gloo compiled in, but
//! not the Gloo headers that `ProcessGroupGloo.hpp` includes, so the shim could only construct
//! it against headers of a guessed Gloo revision, an ABI mismatch waiting to happen. What the
//! ranks exchange before the ring exists (its addresses, NCCL's id) goes through c10d's
//! `TCPStore` ([`super::group`]), which needs no more than libtorch's own headers.
//!
//! The algorithms are the bandwidth-optimal rings (NCCL's ring algorithm): reduce-scatter in
//! world − 1 steps, each rank adding its own chunk to the partial sum it receives and passing it
//! on; all-gather in world − 1 steps passing chunks on; all-reduce as the two in turn (every rank
//! ends with the same bytes, as the engine's replicated states need); broadcast down the ring in
//! pieces. Sums follow [`super::mpi`]: 16-bit floats are added in fp32 and rounded once per
//! pairwise addition. Each step sends and receives at once (the send on a scoped thread), so no
//! rank waits on a full socket buffer.
//!
//! Failure: a rank that dies closes its sockets, and its neighbours' calls fail at once. A rank
//! that hangs is the stall guard's (`--stall-timeout-s`) to stop; collectives themselves wait as
//! long as a step may take.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::ops::Range;
use std::time::{Duration, Instant};

use tch::{Device, Tensor};

use super::group::{HostGroup, StoreGroup};
use super::{flat, is_rank_slice, Blocking, CollectiveKind, Collectives, CommError, Elem, HostCopy, Pending, StepComm};
use crate::metrics::clock::SharedClock;
use crate::metrics::timeline::SharedTimeline;

/// Broadcasts move down the ring in pieces of this many bytes, so the ranks forward in parallel.
const PIECE: usize = 1 << 20;
/// Ring addresses are exchanged padded to this many bytes (`[v6 address]:port` fits).
const ADDR_BYTES: usize = 64;

pub struct TcpCollectives {
    /// To rank + 1. The sockets are dropped before `host`: a rank that stops closes them first,
    /// so its neighbours' calls fail at once instead of waiting on rank 0's store at exit.
    next: TcpStream,
    /// From rank − 1.
    prev: TcpStream,
    host: HostGroup,
    rank: usize,
    world: usize,
    calls: Blocking,
}

fn io_err(op: &'static str, e: impl std::fmt::Display) -> CommError {
    CommError::Failed { op, message: e.to_string() }
}

impl TcpCollectives {
    /// Builds the ring of the ranks of `group`: each rank listens on the group's advertised
    /// address of its host, publishes it, connects to the next rank and accepts the previous one,
    /// all within the group's timeout.
    pub fn connect(group: StoreGroup) -> Result<Self, CommError> {
        const OP: &str = "ring setup";
        let (advertise, timeout) = (group.advertise, group.timeout);
        let mut host = HostGroup::Store(group);
        let (rank, world) = (host.rank(), host.size());
        let deadline = Instant::now() + timeout;
        let listener =
            TcpListener::bind((advertise, 0)).map_err(|e| io_err(OP, format!("listen on {advertise}: {e}")))?;
        let mine = listener.local_addr().map_err(|e| io_err(OP, e))?.to_string();
        let mut padded = [0u8; ADDR_BYTES];
        padded[..mine.len()].copy_from_slice(mine.as_bytes());
        let addrs = host.all_gather_bytes(&padded)?;
        let next_rank = (rank + 1) % world;
        let next_addr: SocketAddr = {
            let b = &addrs[next_rank];
            let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
            String::from_utf8_lossy(&b[..end])
                .parse()
                .map_err(|e| io_err(OP, format!("rank {next_rank} published a bad address: {e}")))?
        };
        // Connect first: the peer's listener queues the connection until it accepts.
        let mut next = TcpStream::connect_timeout(&next_addr, timeout)
            .map_err(|e| io_err(OP, format!("connect to rank {next_rank} at {next_addr}: {e}")))?;
        next.write_all(&(rank as u32).to_le_bytes()).map_err(|e| io_err(OP, e))?;
        let prev = accept_until(&listener, deadline).map_err(|e| io_err(OP, e))?;
        let prev_rank = (rank + world - 1) % world;
        let mut hello = [0u8; 4];
        prev.set_read_timeout(Some(deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))))
            .map_err(|e| io_err(OP, e))?;
        (&prev).read_exact(&mut hello).map_err(|e| io_err(OP, format!("hello from rank {prev_rank}: {e}")))?;
        if u32::from_le_bytes(hello) as usize != prev_rank {
            return Err(io_err(
                OP,
                format!("expected rank {prev_rank} to connect, got rank {}", u32::from_le_bytes(hello)),
            ));
        }
        for s in [&next, &prev] {
            s.set_read_timeout(None).map_err(|e| io_err(OP, e))?;
            s.set_nodelay(true).map_err(|e| io_err(OP, e))?;
        }
        Ok(Self { next, prev, host, rank, world, calls: Blocking::default() })
    }

    /// Sends `out` to the next rank while receiving `inp` from the previous one.
    fn exchange(&self, out: &[u8], inp: &mut [u8]) -> Result<(), String> {
        let (next, prev) = (&self.next, &self.prev);
        std::thread::scope(|s| {
            let sender = s.spawn(move || {
                let mut w: &TcpStream = next;
                w.write_all(out)
            });
            let mut r: &TcpStream = prev;
            let got = r.read_exact(inp).map_err(|e| format!("receiving from rank {}: {e}", self.prev_rank()));
            let sent = sender.join().unwrap_or_else(|_| Err(std::io::Error::other("sender thread panicked")));
            got.and(sent.map_err(|e| format!("sending to rank {}: {e}", (self.rank + 1) % self.world)))
        })
    }

    fn prev_rank(&self) -> usize {
        (self.rank + self.world - 1) % self.world
    }

    /// This rank's chunk (`ranges[rank]`) of the sum over ranks of `src`.
    fn ring_reduce_scatter(&self, e: Elem, src: &[u8], ranges: &[Range<usize>]) -> Result<Vec<u8>, String> {
        let (r, n) = (self.rank, self.world);
        // The chunk whose partial sum this rank receives at step k (k = 0: the one it starts with);
        // at the last step it is this rank's own, complete once its share is added.
        let chunk = |k: usize| (r + 2 * n - k - 1) % n;
        let mut acc = src[ranges[chunk(0)].clone()].to_vec();
        let mut inbox = Vec::new();
        for k in 1..n {
            let c = chunk(k);
            inbox.resize(ranges[c].len(), 0);
            self.exchange(&acc, &mut inbox)?;
            add_into(e, &mut inbox, &src[ranges[c].clone()]);
            std::mem::swap(&mut acc, &mut inbox);
        }
        Ok(acc)
    }

    /// Fills every chunk of `buf` from the rank owning it; this rank's (`ranges[rank]`) is in place.
    fn ring_all_gather(&self, buf: &mut [u8], ranges: &[Range<usize>]) -> Result<(), String> {
        let (r, n) = (self.rank, self.world);
        for k in 0..n - 1 {
            let (send, recv) = disjoint(buf, ranges[(r + n - k) % n].clone(), ranges[(r + 2 * n - k - 1) % n].clone());
            self.exchange(send, recv)?;
        }
        Ok(())
    }

    /// `buf` := the sum over ranks of `buf`: a reduce-scatter, then an all-gather of the sums.
    fn ring_all_reduce(&self, e: Elem, buf: &mut [u8], ranges: &[Range<usize>]) -> Result<(), String> {
        let mine = self.ring_reduce_scatter(e, buf, ranges)?;
        buf[ranges[self.rank].clone()].copy_from_slice(&mine);
        self.ring_all_gather(buf, ranges)
    }

    /// `buf` := `buf` of rank `root`, passed down the ring from the root.
    fn ring_broadcast(&self, buf: &mut [u8], root: usize) -> Result<(), String> {
        let forward = (self.rank + 1) % self.world != root;
        for piece in buf.chunks_mut(PIECE) {
            if self.rank != root {
                (&self.prev).read_exact(piece).map_err(|e| format!("receiving from rank {}: {e}", self.prev_rank()))?;
            }
            if forward {
                (&self.next).write_all(piece).map_err(|e| format!("sending on: {e}"))?;
            }
        }
        Ok(())
    }

    /// `world` chunks of `n` elements of `e` (the first ones one element larger when uneven), in bytes.
    fn chunks(&self, e: Elem, n: usize) -> Vec<Range<usize>> {
        let w = self.world;
        (0..w).map(|i| (i * n / w * e.size())..((i + 1) * n / w * e.size())).collect()
    }

    /// The bytes of a contiguous CPU tensor of a summable type.
    fn cpu(t: &Tensor, op: &'static str) -> Result<(Elem, usize), CommError> {
        if t.device() != Device::Cpu {
            return Err(CommError::BadTensor { op, reason: "TCP collectives move CPU tensors".into() });
        }
        flat(t, op)
    }
}

/// Waits for one connection on `listener` until `deadline`.
fn accept_until(listener: &TcpListener, deadline: Instant) -> std::io::Result<TcpStream> {
    listener.set_nonblocking(true)?;
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the previous rank did not connect before the rendezvous timeout",
                    ));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(e),
        }
    }
}

/// `a` for reading and `b` for writing, two non-overlapping ranges of `buf` (either may be empty,
/// when a tensor has fewer elements than there are ranks).
fn disjoint(buf: &mut [u8], a: Range<usize>, b: Range<usize>) -> (&[u8], &mut [u8]) {
    if a.end <= b.start {
        let (lo, hi) = buf.split_at_mut(b.start);
        (&lo[a], &mut hi[..b.len()])
    } else {
        let (lo, hi) = buf.split_at_mut(a.start);
        (&hi[..a.len()], &mut lo[b])
    }
}

/// `acc` := `acc` + `other`, element-wise, in the pairwise rounding of [`super::mpi`].
fn add_into(e: Elem, acc: &mut [u8], other: &[u8]) {
    match e {
        Elem::F32 => {
            for (a, b) in acc.chunks_exact_mut(4).zip(other.chunks_exact(4)) {
                let s = f32::from_ne_bytes([a[0], a[1], a[2], a[3]]) + f32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
                a.copy_from_slice(&s.to_ne_bytes());
            }
        }
        Elem::Bf16 => add16(acc, other, |x| half::bf16::from_bits(x).to_f32(), |y| half::bf16::from_f32(y).to_bits()),
        Elem::F16 => add16(acc, other, |x| half::f16::from_bits(x).to_f32(), |y| half::f16::from_f32(y).to_bits()),
    }
}

fn add16(acc: &mut [u8], other: &[u8], to: impl Fn(u16) -> f32, from: impl Fn(f32) -> u16) {
    for (a, b) in acc.chunks_exact_mut(2).zip(other.chunks_exact(2)) {
        let s = to(u16::from_ne_bytes([a[0], a[1]])) + to(u16::from_ne_bytes([b[0], b[1]]));
        a.copy_from_slice(&from(s).to_ne_bytes());
    }
}

/// The bytes of a contiguous CPU tensor.
///
/// # Safety
/// `t` must be a contiguous CPU tensor of `bytes` bytes whose memory stays alive and is not
/// otherwise accessed while the slice is.
unsafe fn bytes_mut<'a>(t: &Tensor, bytes: usize) -> &'a mut [u8] {
    // SAFETY: forwarded contract.
    unsafe { std::slice::from_raw_parts_mut(t.data_ptr().cast::<u8>(), bytes) }
}

impl Collectives for TcpCollectives {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn all_reduce(&mut self, buf: &Tensor) -> Result<Pending, CommError> {
        const OP: &str = "all_reduce";
        let (e, n) = Self::cpu(buf, OP)?;
        let ranges = self.chunks(e, n);
        let mut calls = std::mem::take(&mut self.calls);
        let r = calls.timed(CollectiveKind::AllReduce, n * e.size(), || {
            // SAFETY: `buf` is a contiguous CPU tensor of `n` elements, used by nothing else
            // during the call.
            self.ring_all_reduce(e, unsafe { bytes_mut(buf, n * e.size()) }, &ranges)
        });
        self.calls = calls;
        r
    }

    fn reduce_scatter(&mut self, input: &Tensor, output: &Tensor) -> Result<Pending, CommError> {
        const OP: &str = "reduce_scatter";
        let (e, n) = Self::cpu(input, OP)?;
        let (eo, m) = Self::cpu(output, OP)?;
        if e != eo || m * self.world != n {
            return Err(CommError::BadTensor {
                op: OP,
                reason: format!("input {n} and output {m} elements on {} ranks", self.world),
            });
        }
        let ranges = self.chunks(e, n);
        let mut calls = std::mem::take(&mut self.calls);
        let r = calls.timed(CollectiveKind::ReduceScatter, n * e.size(), || {
            // The input is only read until the result exists, and the output (which may be a
            // slice of it) only written after: the two borrows never overlap in time.
            // SAFETY: contiguous CPU tensors of the checked sizes.
            let mine = self.ring_reduce_scatter(e, unsafe { bytes_mut(input, n * e.size()) }, &ranges)?;
            // SAFETY: as above; the input's slice is no longer used.
            unsafe { bytes_mut(output, m * e.size()) }.copy_from_slice(&mine);
            Ok(())
        });
        self.calls = calls;
        r
    }

    fn all_gather(&mut self, input: &Tensor, output: &Tensor) -> Result<Pending, CommError> {
        const OP: &str = "all_gather";
        let (e, n) = Self::cpu(input, OP)?;
        let (eo, m) = Self::cpu(output, OP)?;
        if e != eo || n * self.world != m {
            return Err(CommError::BadTensor {
                op: OP,
                reason: format!("input {n} and output {m} elements on {} ranks", self.world),
            });
        }
        let ranges = self.chunks(e, m);
        let in_place = is_rank_slice(input, output, self.rank, self.world);
        let mut calls = std::mem::take(&mut self.calls);
        let r = calls.timed(CollectiveKind::AllGather, m * e.size(), || {
            if !in_place {
                // SAFETY: contiguous CPU tensors of the checked sizes; not a slice of the output.
                let mine = unsafe { bytes_mut(input, n * e.size()) }.to_vec();
                // SAFETY: as above.
                let out = unsafe { bytes_mut(output, m * e.size()) };
                out[ranges[self.rank].clone()].copy_from_slice(&mine);
            }
            // SAFETY: as above; the input is no longer read.
            self.ring_all_gather(unsafe { bytes_mut(output, m * e.size()) }, &ranges)
        });
        self.calls = calls;
        r
    }

    fn broadcast(&mut self, buf: &Tensor, root: usize) -> Result<Pending, CommError> {
        const OP: &str = "broadcast";
        let (e, n) = Self::cpu(buf, OP)?;
        if root >= self.world {
            return Err(CommError::BadTensor { op: OP, reason: format!("root {root} of {} ranks", self.world) });
        }
        let mut calls = std::mem::take(&mut self.calls);
        let r = calls.timed(CollectiveKind::Broadcast, n * e.size(), || {
            // SAFETY: a contiguous CPU tensor of `n` elements, used by nothing else during the call.
            self.ring_broadcast(unsafe { bytes_mut(buf, n * e.size()) }, root)
        });
        self.calls = calls;
        r
    }

    fn wait(&mut self, _pending: Pending) -> Result<(), CommError> {
        Ok(())
    }

    fn barrier(&mut self) -> Result<(), CommError> {
        self.host.barrier()
    }

    fn copy_to_host(&mut self, src: &Tensor, dst: &Tensor) -> Result<(Pending, HostCopy), CommError> {
        let p = self.calls.host_copy(CollectiveKind::DeviceToHost, src, dst)?;
        Ok((p, HostCopy::Done))
    }

    fn copy_to_device(&mut self, src: &Tensor, dst: &Tensor) -> Result<Pending, CommError> {
        self.calls.host_copy(CollectiveKind::HostToDevice, src, dst)
    }

    fn copy_device(&mut self, src: &Tensor, dst: &Tensor) -> Result<Pending, CommError> {
        self.calls.host_copy(CollectiveKind::DeviceToDevice, src, dst)
    }

    fn reduce_control(&mut self, buf: &Tensor) -> Result<(), CommError> {
        const OP: &str = "reduce_control";
        let (e, n) = Self::cpu(buf, OP)?;
        if e != Elem::F32 {
            return Err(CommError::BadTensor { op: OP, reason: "control values are fp32 on the CPU".into() });
        }
        let ranges = self.chunks(e, n);
        // SAFETY: a contiguous fp32 CPU tensor of `n` elements, used by nothing else meanwhile.
        self.ring_all_reduce(e, unsafe { bytes_mut(buf, n * e.size()) }, &ranges).map_err(|m| io_err(OP, m))
    }

    fn max_over_ranks(&mut self, values: &mut [f64]) -> Result<(), CommError> {
        self.host.max_f64(values)
    }

    fn take_stats(&mut self) -> Result<StepComm, CommError> {
        Ok(std::mem::take(&mut self.calls.stats))
    }

    fn backend(&self) -> &'static str {
        "tcp"
    }

    fn set_timeline(&mut self, timeline: SharedTimeline) {
        self.calls.timeline = Some(timeline);
    }

    fn set_clock(&mut self, clock: SharedClock) {
        self.calls.clock = Some(clock);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disjoint_ranges_split_either_way_and_empty() {
        let mut buf: Vec<u8> = (0..8).collect();
        for (a, b) in [(0..4, 4..8), (4..8, 0..4), (0..4, 0..0), (4..4, 0..4), (2..2, 2..2)] {
            let (x, y) = disjoint(&mut buf, a.clone(), b.clone());
            assert_eq!((x.len(), y.len()), (a.len(), b.len()));
            assert_eq!(x.first().copied(), (!a.is_empty()).then_some(a.start as u8));
            assert_eq!(y.first().copied(), (!b.is_empty()).then_some(b.start as u8));
        }
    }

    #[test]
    fn sums_round_16_bit_floats_once_per_addition() {
        let mut acc: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|v| v.to_ne_bytes()).collect();
        let other: Vec<u8> = [0.25f32, 2.0].iter().flat_map(|v| v.to_ne_bytes()).collect();
        add_into(Elem::F32, &mut acc, &other);
        assert_eq!(acc, [1.75f32, 0.0].iter().flat_map(|v| v.to_ne_bytes()).collect::<Vec<u8>>());
        // 256 + 1 is not a bf16: the sum rounds to even, 256.
        let bf = |v: f32| half::bf16::from_f32(v).to_bits().to_ne_bytes();
        let mut acc = bf(256.0).to_vec();
        add_into(Elem::Bf16, &mut acc, &bf(1.0));
        assert_eq!(acc, bf(256.0));
        let f16 = |v: f32| half::f16::from_f32(v).to_bits().to_ne_bytes();
        let mut acc = f16(0.5).to_vec();
        add_into(Elem::F16, &mut acc, &f16(0.25));
        assert_eq!(acc, f16(0.75));
    }
}
