//! The user-space dedup pool for read-only data such as model weights.
//!
//! Data enters by name and is cut into page-sized chunks. Each chunk is addressed by a keyed
//! hash (SipHash-2-4, 128 bits) whose key is drawn at random for each pool, and a pool serves
//! exactly one security domain: chunks of different domains never compare equal, because they
//! are never in the same pool and their hashes use different keys. A hash hit is confirmed byte
//! for byte before a chunk is shared.
//!
//! Shared chunks live in memfd segments that are sealed (no write, grow, shrink or further seal)
//! before anyone maps them, and are mapped `MAP_PRIVATE`: a write to a shared page gets a
//! kernel copy-on-write copy and the pool stays intact. A [`Handle`] carries the segments'
//! descriptors and the chunk layout to another process over a Unix socket; the pool hands one
//! out only to a peer of its own domain, checked with `SO_PEERCRED`.
//!
//! Two behaviours on write. By default a chunk that nobody else holds stays in its holder's
//! ordinary anonymous memory (the pool remembers only its hash): unique data costs nothing extra
//! and writes to it do not fault. That makes a first write cheap for an unshared page and a
//! copy-on-write fault for a shared one, the same probe that reveals kernel KSM merges, but
//! only within the domain. With [`PoolOptions::same_behaviour`] every chunk is placed in the
//! pool and mapped copy-on-write, so a first write costs one fault whether or not anyone else
//! holds the page.
//!
//! Aging: an entry's last use is recorded when it is inserted, mapped or touched, and a chunk is
//! as hot as the hottest entry that holds it. Eviction removes the coldest entries and frees
//! only chunks no remaining entry holds, so a chunk shared with a hot entry is never dropped
//! because one of its users went cold. Processes that mapped an evicted entry keep their pages:
//! the kernel frees a segment when its last mapping goes.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;

use std::hash::Hasher;

use siphasher::sip128::{Hasher128, SipHasher24};

use crate::process::{Domain, DomainKind, Procfs};
use crate::sys::{self, Region};
use crate::MemError;

/// Pool settings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolOptions {
    /// Place every chunk in the pool and map it copy-on-write, so that the first write to a
    /// page costs the same whether or not the page is shared (closes the write-timing probe
    /// within the domain, at the cost of a fault on the first write to unique data).
    pub same_behaviour: bool,
}

type ChunkId = usize;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    /// The chunk is in a pool segment.
    Pooled(ChunkId),
    /// The chunk is unique so far and lives in its holder's anonymous memory; the pool knows
    /// its hash.
    Private(u128),
}

struct Segment {
    file: File,
    bytes: usize,
    live_chunks: usize,
}

struct Chunk {
    segment: usize,
    offset: u64,
    hash: u128,
    holders: usize,
}

struct Entry {
    slots: Vec<Slot>,
    len: usize,
    last_use: u64,
}

/// Per-pool figures.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PoolStats {
    /// The pool's domain.
    pub domain: String,
    /// Named entries held.
    pub entries: usize,
    /// Bytes of all entries, page-rounded: what they would take unshared.
    pub logical_bytes: u64,
    /// Bytes of chunks in pool segments that some entry holds.
    pub pooled_bytes: u64,
    /// Bytes of segments kept alive by a live chunk but no longer held by any entry.
    pub pinned_bytes: u64,
    /// Bytes of unique chunks living in their holders' memory.
    pub private_bytes: u64,
    /// `logical - pooled - private`: what deduplication saves.
    pub saved_bytes: u64,
    /// `logical / (pooled + private)`.
    pub sharing_factor: f64,
}

/// A deduplicating store of read-only data for one security domain.
pub struct Pool {
    domain: Domain,
    options: PoolOptions,
    key: (u64, u64),
    segments: Vec<Option<Segment>>,
    chunks: Vec<Option<Chunk>>,
    index: HashMap<u128, ChunkId>,
    pending: HashMap<u128, String>,
    entries: BTreeMap<String, Entry>,
    clock: u64,
    procfs: Procfs,
}

/// A named entry mapped into this process: its bytes are readable and writable, and writes never
/// reach the pool or any other holder.
pub struct Mapping {
    region: Region,
    len: usize,
    name: String,
    private: Vec<bool>,
}

impl Mapping {
    /// The entry's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.region.as_slice()[..self.len]
    }

    /// The bytes, writable. The first write to a page mapped from the pool makes a private copy.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.region.as_mut_slice()[..self.len]
    }

    /// How many of its pages are its own anonymous memory rather than pool pages.
    pub fn private_pages(&self) -> usize {
        self.private.iter().filter(|p| **p).count()
    }
}

impl Pool {
    /// An empty pool for `domain`, with a fresh random hash key.
    pub fn new(domain: Domain, options: PoolOptions) -> Result<Pool, MemError> {
        let procfs = Procfs::system();
        if domain.kind() == DomainKind::Label {
            procfs.check_labels()?;
        }
        let mut key = [0u8; 16];
        sys::random_bytes(&mut key).map_err(|e| MemError::Os("getrandom".into(), e))?;
        Ok(Pool {
            domain,
            options,
            key: (
                u64::from_le_bytes(key[..8].try_into().unwrap()),
                u64::from_le_bytes(key[8..].try_into().unwrap()),
            ),
            segments: Vec::new(),
            chunks: Vec::new(),
            index: HashMap::new(),
            pending: HashMap::new(),
            entries: BTreeMap::new(),
            clock: 0,
            procfs,
        })
    }

    /// Reads peers' cgroups and labels from a `/proc` copy at `procfs` instead of the system's
    /// (tests).
    pub fn set_procfs(&mut self, procfs: Procfs) {
        self.procfs = procfs;
    }

    /// The domain this pool serves.
    pub fn domain(&self) -> &Domain {
        &self.domain
    }

    /// The pool's options.
    pub fn options(&self) -> PoolOptions {
        self.options
    }

    fn hash(&self, chunk: &[u8]) -> u128 {
        let mut hasher = SipHasher24::new_with_keys(self.key.0, self.key.1);
        hasher.write(chunk);
        hasher.finish128().as_u128()
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Stores `bytes` under `name` and maps them into this process. Chunks equal to ones the
    /// pool holds are shared; the rest are unique (see the module notes for where they live).
    pub fn insert(&mut self, name: &str, bytes: &[u8]) -> Result<Mapping, MemError> {
        if self.entries.contains_key(name) {
            return Err(MemError::Usage(format!(
                "the pool for {} already holds an entry named `{name}`",
                self.domain
            )));
        }
        let page = sys::page_size();
        let mut slots = Vec::with_capacity(bytes.len().div_ceil(page));
        // Chunks new to the pool, gathered into one segment; `None` marks a slot to fill later.
        let mut fresh: Vec<(usize, u128)> = Vec::new();
        let mut fresh_bytes: Vec<u8> = Vec::new();
        let mut padded = vec![0u8; page];
        for (i, chunk) in bytes.chunks(page).enumerate() {
            let chunk = if chunk.len() == page {
                chunk
            } else {
                padded.fill(0);
                padded[..chunk.len()].copy_from_slice(chunk);
                &padded[..]
            };
            let hash = self.hash(chunk);
            if let Some(&id) = self.index.get(&hash) {
                if self.chunk_equals(id, chunk)? {
                    slots.push(Slot::Pooled(id));
                    continue;
                }
            }
            if let Some(fresh_at) = fresh.iter().position(|(_, h)| *h == hash) {
                let at = fresh_at * page;
                if fresh_bytes[at..at + page] == *chunk {
                    slots.push(slots[fresh[fresh_at].0]);
                    continue;
                }
            }
            let promote = self.pending.contains_key(&hash);
            if self.options.same_behaviour || promote {
                fresh.push((i, hash));
                fresh_bytes.extend_from_slice(chunk);
                slots.push(Slot::Private(hash)); // replaced below
            } else {
                slots.push(Slot::Private(hash));
            }
        }
        // Fresh chunks: one sealed segment, then the slots point into it.
        if !fresh.is_empty() {
            let hashes: Vec<u128> = fresh.iter().map(|(_, h)| *h).collect();
            let ids = self.add_segment(&fresh_bytes, &hashes)?;
            for (&id, (slot_index, hash)) in ids.iter().zip(&fresh) {
                if let Some(holder) = self.pending.remove(hash) {
                    // The entry holding it privately now holds the pooled chunk; its mapping
                    // switches over on `refresh`.
                    if let Some(entry) = self.entries.get_mut(&holder) {
                        for slot in &mut entry.slots {
                            if *slot == Slot::Private(*hash) {
                                *slot = Slot::Pooled(id);
                                self.chunks[id].as_mut().unwrap().holders += 1;
                            }
                        }
                    }
                }
                slots[*slot_index] = Slot::Pooled(id);
            }
            // Later duplicates inside this insert copied the placeholder; point them too.
            for slot in &mut slots {
                if let Slot::Private(hash) = *slot {
                    if let Some(&(_, _)) = fresh.iter().find(|(_, h)| *h == hash) {
                        *slot = Slot::Pooled(self.index[&hash]);
                    }
                }
            }
        }
        for slot in &slots {
            match *slot {
                Slot::Pooled(id) => self.chunks[id].as_mut().unwrap().holders += 1,
                Slot::Private(hash) => {
                    self.pending.entry(hash).or_insert_with(|| name.to_string());
                }
            }
        }
        let last_use = self.tick();
        self.entries.insert(
            name.to_string(),
            Entry {
                slots,
                len: bytes.len(),
                last_use,
            },
        );
        self.map_entry(name, Some(bytes))
    }

    fn chunk_equals(&self, id: ChunkId, chunk: &[u8]) -> Result<bool, MemError> {
        let info = self.chunks[id].as_ref().unwrap();
        let segment = self.segments[info.segment].as_ref().unwrap();
        let mut stored = vec![0u8; chunk.len()];
        segment
            .file
            .read_exact_at(&mut stored, info.offset)
            .map_err(|e| MemError::Os("reading a pool segment".into(), e))?;
        Ok(stored == chunk)
    }

    /// Writes `bytes` (one page per hash) into a new sealed segment and indexes its chunks.
    fn add_segment(&mut self, bytes: &[u8], hashes: &[u128]) -> Result<Vec<ChunkId>, MemError> {
        let os = |what: &str| {
            let what = what.to_string();
            move |e| MemError::Os(what, e)
        };
        let mut file =
            sys::memfd(&format!("kfuse-pool-{}", self.domain)).map_err(os("memfd_create"))?;
        file.write_all(bytes)
            .map_err(os("writing a pool segment"))?;
        sys::add_seals(&file, sys::FULL_SEALS).map_err(os("sealing a pool segment"))?;
        self.segments.push(Some(Segment {
            file,
            bytes: bytes.len(),
            live_chunks: hashes.len(),
        }));
        let segment = self.segments.len() - 1;
        let page = sys::page_size() as u64;
        let mut ids = Vec::with_capacity(hashes.len());
        for (n, &hash) in hashes.iter().enumerate() {
            let id = self.chunks.len();
            self.chunks.push(Some(Chunk {
                segment,
                offset: n as u64 * page,
                hash,
                holders: 0,
            }));
            self.index.insert(hash, id);
            ids.push(id);
        }
        Ok(ids)
    }

    /// Maps an entry: runs of pooled chunks that are adjacent in one segment become one private
    /// file mapping; private chunks are copied from `source` (the inserting caller's bytes).
    fn map_entry(&self, name: &str, source: Option<&[u8]>) -> Result<Mapping, MemError> {
        let entry = &self.entries[name];
        let page = sys::page_size();
        let mut region = Region::reserve(entry.slots.len() * page)
            .map_err(|e| MemError::Os("mmap".into(), e))?;
        let mut private = vec![false; entry.slots.len()];
        let mut i = 0;
        while i < entry.slots.len() {
            match entry.slots[i] {
                Slot::Pooled(id) => {
                    let first = self.chunks[id].as_ref().unwrap();
                    let mut run = 1;
                    while let Some(Slot::Pooled(next)) = entry.slots.get(i + run) {
                        let next = self.chunks[*next].as_ref().unwrap();
                        if next.segment != first.segment
                            || next.offset != first.offset + (run * page) as u64
                        {
                            break;
                        }
                        run += 1;
                    }
                    let file = &self.segments[first.segment].as_ref().unwrap().file;
                    region
                        .map_file_private(i * page, run * page, file, first.offset)
                        .map_err(|e| MemError::Os("mapping a pool segment".into(), e))?;
                    i += run;
                }
                Slot::Private(_) => {
                    let source = source.ok_or_else(|| {
                        MemError::Usage(format!(
                            "entry `{name}` has unique chunks that live only in its holder's \
                             memory; share it from the holder with `Pool::share` first"
                        ))
                    })?;
                    let end = ((i + 1) * page).min(source.len());
                    region
                        .fill_anonymous(i * page, &source[i * page..end])
                        .map_err(|e| MemError::Os("mmap".into(), e))?;
                    private[i] = true;
                    i += 1;
                }
            }
        }
        Ok(Mapping {
            region,
            len: entry.len,
            name: name.to_string(),
            private,
        })
    }

    /// Maps an entry whose chunks are all in the pool (every entry in same-behaviour mode, or
    /// one that was shared), and records the use.
    pub fn map(&mut self, name: &str) -> Result<Mapping, MemError> {
        self.touch(name)?;
        self.map_entry(name, None)
    }

    /// Records a use of an entry (for aging).
    pub fn touch(&mut self, name: &str) -> Result<(), MemError> {
        let now = self.tick();
        let missing = self.missing(name);
        let entry = self.entries.get_mut(name).ok_or(missing)?;
        entry.last_use = now;
        Ok(())
    }

    fn missing(&self, name: &str) -> MemError {
        MemError::Usage(format!(
            "the pool for {} has no entry `{name}`",
            self.domain
        ))
    }

    /// Moves a mapping's pages that the pool now holds (because another entry brought the same
    /// content) from its private memory onto the pool's copy, after checking the bytes are
    /// still equal. Returns the number of pages moved.
    pub fn refresh(&self, mapping: &mut Mapping) -> Result<usize, MemError> {
        let entry = self
            .entries
            .get(&mapping.name)
            .ok_or_else(|| self.missing(&mapping.name))?;
        let page = sys::page_size();
        let mut moved = 0;
        for (i, slot) in entry.slots.iter().enumerate() {
            let Slot::Pooled(id) = *slot else { continue };
            if !mapping.private[i] {
                continue;
            }
            let chunk = &mapping.region.as_slice()[i * page..(i + 1) * page];
            if !self.chunk_equals(id, chunk)? {
                continue; // The holder wrote to its copy: it keeps it.
            }
            let info = self.chunks[id].as_ref().unwrap();
            let file = &self.segments[info.segment].as_ref().unwrap().file;
            mapping
                .region
                .map_file_private(i * page, page, file, info.offset)
                .map_err(|e| MemError::Os("mapping a pool segment".into(), e))?;
            mapping.private[i] = false;
            moved += 1;
        }
        Ok(moved)
    }

    /// Puts a mapping's unique chunks into the pool (so other processes can map the entry) and
    /// moves the mapping onto them. Fails if the holder has written to a unique chunk since the
    /// insert: the pool shares what was inserted, never a holder's later changes.
    pub fn share(&mut self, mapping: &mut Mapping) -> Result<Handle, MemError> {
        let page = sys::page_size();
        let name = mapping.name.clone();
        let entry = self.entries.get(&name).ok_or_else(|| self.missing(&name))?;
        let mut fresh = Vec::new();
        let mut fresh_bytes = Vec::new();
        for (i, slot) in entry.slots.iter().enumerate() {
            if let Slot::Private(hash) = *slot {
                let chunk = &mapping.region.as_slice()[i * page..(i + 1) * page];
                if self.hash(chunk) != hash {
                    return Err(MemError::Usage(format!(
                        "page {i} of `{name}` was written after it was inserted; only \
                         unmodified data is shared"
                    )));
                }
                if !fresh.iter().any(|(_, h)| *h == hash) {
                    fresh.push((i, hash));
                    fresh_bytes.extend_from_slice(chunk);
                }
            }
        }
        if !fresh.is_empty() {
            let hashes: Vec<u128> = fresh.iter().map(|(_, h)| *h).collect();
            self.add_segment(&fresh_bytes, &hashes)?;
            for hash in &hashes {
                self.pending.remove(hash);
            }
            let entry = self.entries.get_mut(&name).unwrap();
            for slot in &mut entry.slots {
                if let Slot::Private(hash) = *slot {
                    let id = self.index[&hash];
                    *slot = Slot::Pooled(id);
                    self.chunks[id].as_mut().unwrap().holders += 1;
                }
            }
        }
        self.refresh(mapping)?;
        self.touch(&name)?;
        self.handle(&name)
    }

    /// A handle to an entry whose chunks are all pooled, for another process of this domain.
    pub fn handle(&self, name: &str) -> Result<Handle, MemError> {
        let entry = self.entries.get(name).ok_or_else(|| self.missing(name))?;
        let mut segment_numbers: BTreeMap<usize, usize> = BTreeMap::new();
        let mut chunks = Vec::with_capacity(entry.slots.len());
        for slot in &entry.slots {
            let Slot::Pooled(id) = *slot else {
                return Err(MemError::Usage(format!(
                    "entry `{name}` has unique chunks in its holder's memory; call \
                     `Pool::share` with the holder's mapping"
                )));
            };
            let info = self.chunks[id].as_ref().unwrap();
            let next = segment_numbers.len();
            let number = *segment_numbers.entry(info.segment).or_insert(next);
            chunks.push((number, info.offset));
        }
        let mut segments = Vec::new();
        for (&segment, _) in segment_numbers.iter() {
            let file = &self.segments[segment].as_ref().unwrap().file;
            segments.push(
                file.try_clone()
                    .map_err(|e| MemError::Os("dup".into(), e))?,
            );
        }
        // `segment_numbers` is ordered by segment id, and numbers were given in first-use order.
        let mut ordered: Vec<(usize, File)> =
            segment_numbers.values().copied().zip(segments).collect();
        ordered.sort_by_key(|(n, _)| *n);
        Ok(Handle {
            name: name.to_string(),
            len: entry.len,
            chunks,
            segments: ordered.into_iter().map(|(_, f)| f).collect(),
        })
    }

    /// Sends the handle of entry `name` to the peer on `stream` if the peer is of this pool's
    /// domain; otherwise sends a refusal and returns an error naming the peer.
    pub fn serve(&self, stream: &UnixStream, name: &str) -> Result<(), MemError> {
        let (uid, _gid, pid) =
            sys::peer_credentials(stream).map_err(|e| MemError::Os("SO_PEERCRED".into(), e))?;
        let peer_domain = match &self.domain {
            // The uid is the kernel's record of the connecting process, pid reuse or not.
            Domain::Uid(_) => Some(Domain::Uid(uid)),
            // A cgroup or label is read from /proc by pid, and a pid names another process once
            // the peer is gone: pin the peer first, and believe what was read only if that very
            // process is still there afterwards.
            other => match sys::PinnedProcess::peer(stream, pid) {
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => None,
                Err(e) => return Err(MemError::Os("pidfd_open".into(), e)),
                Ok(peer) => {
                    let domain = self.procfs.domain(pid as u32, other.kind())?;
                    let there = peer
                        .still_there()
                        .map_err(|e| MemError::Os("pidfd_send_signal".into(), e))?;
                    domain.filter(|_| there)
                }
            },
        };
        if peer_domain.as_ref() != Some(&self.domain) {
            let reason = match peer_domain {
                Some(domain) => format!(
                    "refused: peer pid {pid} is in {domain} and this pool serves {}",
                    self.domain
                ),
                None => format!(
                    "refused: peer pid {pid} exited before its domain could be checked, and \
                     this pool serves {}",
                    self.domain
                ),
            };
            let _ = sys::send_with_fds(stream, format!("error {reason}").as_bytes(), &[]);
            return Err(MemError::Refused(reason));
        }
        self.handle(name)?.send(stream)
    }

    /// Removes an entry. Its pooled chunks are freed once no entry holds them; mappings already
    /// made keep their pages.
    pub fn remove(&mut self, name: &str) -> Result<(), MemError> {
        let entry = self
            .entries
            .remove(name)
            .ok_or_else(|| self.missing(name))?;
        for slot in entry.slots {
            match slot {
                Slot::Pooled(id) => self.release_chunk(id),
                Slot::Private(hash) => {
                    if self.pending.get(&hash).is_some_and(|holder| holder == name) {
                        self.pending.remove(&hash);
                    }
                }
            }
        }
        Ok(())
    }

    fn release_chunk(&mut self, id: ChunkId) {
        let chunk = self.chunks[id].as_mut().unwrap();
        chunk.holders -= 1;
        if chunk.holders > 0 {
            return;
        }
        let (segment, hash) = (chunk.segment, chunk.hash);
        self.chunks[id] = None;
        if self.index.get(&hash) == Some(&id) {
            self.index.remove(&hash);
        }
        let seg = self.segments[segment].as_mut().unwrap();
        seg.live_chunks -= 1;
        if seg.live_chunks == 0 {
            self.segments[segment] = None;
        }
    }

    /// How hot a chunk is: the last use of the hottest entry holding it.
    fn chunk_heat(&self) -> HashMap<ChunkId, u64> {
        let mut heat: HashMap<ChunkId, u64> = HashMap::new();
        for entry in self.entries.values() {
            for slot in &entry.slots {
                if let Slot::Pooled(id) = *slot {
                    let h = heat.entry(id).or_insert(0);
                    *h = (*h).max(entry.last_use);
                }
            }
        }
        heat
    }

    /// Evicts the coldest entries until the pool's segments hold at most `budget_bytes`, and
    /// returns their names. An entry is only worth evicting for the chunks that no hotter entry
    /// holds: its shared chunks stay, as hot as their hottest holder.
    pub fn evict_to(&mut self, budget_bytes: u64) -> Vec<String> {
        let mut evicted = Vec::new();
        while self.segment_bytes() > budget_bytes {
            let heat = self.chunk_heat();
            // The entry whose chunks it alone keeps alive are the coldest; entries that free
            // nothing are not evicted.
            let victim = self
                .entries
                .iter()
                .filter(|(_, e)| {
                    e.slots.iter().any(|s| match *s {
                        Slot::Pooled(id) => heat[&id] == e.last_use,
                        Slot::Private(_) => false,
                    })
                })
                .min_by_key(|(_, e)| e.last_use)
                .map(|(name, _)| name.clone());
            let Some(victim) = victim else { break };
            self.remove(&victim).expect("victim exists");
            evicted.push(victim);
        }
        evicted
    }

    fn segment_bytes(&self) -> u64 {
        self.segments.iter().flatten().map(|s| s.bytes as u64).sum()
    }

    /// The entries held, with their lengths in bytes.
    pub fn entries(&self) -> impl Iterator<Item = (&str, usize)> {
        self.entries.iter().map(|(n, e)| (n.as_str(), e.len))
    }

    /// The pool's figures.
    pub fn stats(&self) -> PoolStats {
        let page = sys::page_size() as u64;
        let logical: u64 = self
            .entries
            .values()
            .map(|e| e.slots.len() as u64 * page)
            .sum();
        let pooled = self.chunks.iter().flatten().count() as u64 * page;
        let private: u64 = self
            .entries
            .values()
            .flat_map(|e| &e.slots)
            .filter(|s| matches!(s, Slot::Private(_)))
            .count() as u64
            * page;
        let stored = pooled + private;
        PoolStats {
            domain: self.domain.to_string(),
            entries: self.entries.len(),
            logical_bytes: logical,
            pooled_bytes: pooled,
            pinned_bytes: self.segment_bytes() - pooled,
            private_bytes: private,
            saved_bytes: logical.saturating_sub(stored),
            sharing_factor: if stored == 0 {
                0.0
            } else {
                logical as f64 / stored as f64
            },
        }
    }
}

/// A pool entry as another process receives it: sealed segment descriptors and where each page
/// comes from.
pub struct Handle {
    name: String,
    len: usize,
    chunks: Vec<(usize, u64)>,
    segments: Vec<File>,
}

/// The largest handle message accepted.
const MAX_HANDLE_MESSAGE: usize = 1 << 24;

impl Handle {
    /// The entry's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Sends the handle over a Unix socket: the layout as text, the segments as descriptors.
    pub fn send(&self, stream: &UnixStream) -> Result<(), MemError> {
        if self.segments.len() > sys::MAX_FDS {
            return Err(MemError::Unsupported(format!(
                "entry `{}` spans {} segments; one message carries at most {}",
                self.name,
                self.segments.len(),
                sys::MAX_FDS
            )));
        }
        let mut text = format!(
            "kfuse-pool 1\n{}\n{}\n{}\n",
            self.name,
            self.len,
            self.segments.len()
        );
        for (segment, offset) in &self.chunks {
            text.push_str(&format!("{segment} {offset}\n"));
        }
        let length = (text.len() as u64).to_le_bytes();
        let fds: Vec<_> = self.segments.iter().map(|f| f.as_raw_fd()).collect();
        sys::send_with_fds(stream, &length, &fds).map_err(|e| MemError::Os("sendmsg".into(), e))?;
        sys::send_all(stream, text.as_bytes())
            .map_err(|e| MemError::Os("sending a pool handle".into(), e))
    }

    /// Receives a handle sent by [`Handle::send`] or a refusal from [`Pool::serve`]. Refuses
    /// segments that are not fully sealed, since their content could change under the mapping.
    pub fn receive(stream: &UnixStream) -> Result<Handle, MemError> {
        use std::io::Read;
        let os = |what: &'static str| move |e| MemError::Os(what.into(), e);
        let (head, fds) = sys::recv_with_fds(stream, 4096).map_err(os("recvmsg"))?;
        if let Some(reason) = head.strip_prefix(b"error ") {
            return Err(MemError::Refused(
                String::from_utf8_lossy(reason).into_owned(),
            ));
        }
        let bad = |what: &str| MemError::BadHandle(what.to_string());
        let length = u64::from_le_bytes(
            head.as_slice()
                .try_into()
                .map_err(|_| bad("the length prefix is not 8 bytes"))?,
        ) as usize;
        if length > MAX_HANDLE_MESSAGE {
            return Err(bad("the layout is larger than 16 MiB"));
        }
        let mut text = vec![0u8; length];
        let mut reader = stream;
        reader
            .read_exact(&mut text)
            .map_err(os("reading a pool handle"))?;
        let text = String::from_utf8(text).map_err(|_| bad("the layout is not UTF-8"))?;
        let mut lines = text.lines();
        if lines.next() != Some("kfuse-pool 1") {
            return Err(bad("unknown header"));
        }
        let name = lines.next().ok_or_else(|| bad("no name"))?.to_string();
        let len: usize = lines
            .next()
            .and_then(|l| l.parse().ok())
            .ok_or_else(|| bad("no length"))?;
        let count: usize = lines
            .next()
            .and_then(|l| l.parse().ok())
            .ok_or_else(|| bad("no segment count"))?;
        if count != fds.len() {
            return Err(bad(
                "the segment count does not match the descriptors received",
            ));
        }
        let segments: Vec<File> = fds.into_iter().map(|fd: OwnedFd| File::from(fd)).collect();
        let page = sys::page_size() as u64;
        let mut sizes = Vec::new();
        for file in &segments {
            let seals = sys::seals(file).map_err(os("F_GET_SEALS"))?;
            if seals & sys::FULL_SEALS != sys::FULL_SEALS {
                return Err(bad("a segment is not sealed against writes and resizing"));
            }
            sizes.push(file.metadata().map_err(os("fstat"))?.len());
        }
        let mut chunks = Vec::new();
        for line in lines {
            let (segment, offset) = line.split_once(' ').ok_or_else(|| bad("bad chunk line"))?;
            let segment: usize = segment.parse().map_err(|_| bad("bad segment number"))?;
            let offset: u64 = offset.parse().map_err(|_| bad("bad chunk offset"))?;
            // The sender chooses the offset: its end is computed without wrapping, since an
            // offset of 2^64 - page would otherwise wrap to 0 and pass.
            if segment >= segments.len()
                || !offset.is_multiple_of(page)
                || offset
                    .checked_add(page)
                    .is_none_or(|end| end > sizes[segment])
            {
                return Err(bad("a chunk lies outside its segment"));
            }
            chunks.push((segment, offset));
        }
        if chunks.len() as u64 != (len as u64).div_ceil(page) {
            return Err(bad("the chunk count does not match the length"));
        }
        Ok(Handle {
            name,
            len,
            chunks,
            segments,
        })
    }

    /// Maps the entry into this process, copy-on-write.
    pub fn map(&self) -> Result<Mapping, MemError> {
        let page = sys::page_size();
        let mut region = Region::reserve(self.chunks.len() * page)
            .map_err(|e| MemError::Os("mmap".into(), e))?;
        let mut i = 0;
        while i < self.chunks.len() {
            let (segment, offset) = self.chunks[i];
            let mut run = 1;
            while self.chunks.get(i + run) == Some(&(segment, offset + (run * page) as u64)) {
                run += 1;
            }
            region
                .map_file_private(i * page, run * page, &self.segments[segment], offset)
                .map_err(|e| MemError::Os("mapping a pool segment".into(), e))?;
            i += run;
        }
        Ok(Mapping {
            region,
            len: self.len,
            name: self.name.clone(),
            private: vec![false; self.chunks.len()],
        })
    }
}
