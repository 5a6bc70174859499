//! Running as one of several processes of an MPI job (`mpiexec -n N cgnmt translate …`, a build with
//! `--features mpi`). Each process learns its rank and the job's size here; `translate` decodes its share of the
//! lines and rank 0 writes the whole output ([`Cluster::gather`]). A process that fails ends the whole job at
//! once: a panic or an error on any rank prints the rank and the cause and aborts the communicator, so no rank
//! waits forever for a peer that is gone.
//!
//! Without the feature the toolkit needs no MPI library: a job of one process is the whole story, and a binary
//! started by `mpiexec` with more than one process says that it was built without MPI and stops, instead of
//! running N copies that each do all the work.

use anyhow::Result;

#[cfg(feature = "mpi")]
mod finalize;

/// Sums of at least this many values per rank are split into one block per rank ([`Cluster::sum_f32`]);
/// shorter ones go through rank 0.
#[cfg(feature = "mpi")]
const SPLIT_SUM_FROM: usize = 1024;

/// `CGNMT_MPI_SUM=root` sends every sum through rank 0 (a reduce and a broadcast), whatever its length: for
/// comparing the two ways in `cgnmt bench` (both leave the same bits on every rank).
#[cfg(feature = "mpi")]
fn sum_through_root() -> bool {
    static ROOT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ROOT.get_or_init(|| std::env::var("CGNMT_MPI_SUM").is_ok_and(|v| v == "root"))
}

/// This process's place in the job.
pub struct Cluster {
    rank: usize,
    size: usize,
    #[cfg(feature = "mpi")]
    universe: Option<mpi::environment::Universe>,
    /// This rank's block of a split sum, kept from call to call (fresh pages cost a fault each).
    #[cfg(feature = "mpi")]
    block: std::cell::RefCell<Vec<f32>>,
}

/// The job's size as the launcher tells it (MPICH's and Open MPI's variables), without MPI itself.
fn launched_size() -> usize {
    ["PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE"]
        .iter()
        .find_map(|k| std::env::var(k).ok()?.parse().ok())
        .unwrap_or(1)
}

impl Cluster {
    /// A job of one process (tests, and commands that never run under `mpiexec`).
    pub fn single() -> Cluster {
        Cluster {
            rank: 0,
            size: 1,
            #[cfg(feature = "mpi")]
            universe: None,
            #[cfg(feature = "mpi")]
            block: Default::default(),
        }
    }

    /// Join the job this process was started in. `command` names the subcommand; `shards` says whether it
    /// runs on several processes (others are refused with a clear error when the job has more than one).
    pub fn init(command: &str, shards: bool) -> Result<Cluster> {
        let launched = launched_size();
        #[cfg(not(feature = "mpi"))]
        {
            if launched > 1 {
                anyhow::bail!(
                    "started as one of {launched} MPI processes, but this cgnmt was built without MPI: build it \
                     with `cargo build --release --features mpi` (see the README), or run one process"
                );
            }
            let _ = (command, shards);
            Ok(Cluster::single())
        }
        #[cfg(feature = "mpi")]
        {
            use mpi::traits::Communicator;
            if launched <= 1 {
                // Not under a launcher: no MPI initialisation at all.
                return Ok(Cluster::single());
            }
            let universe = mpi::initialize()
                .ok_or_else(|| anyhow::anyhow!("MPI was initialised twice in this process"))?;
            let world = universe.world();
            let (rank, size) = (world.rank() as usize, world.size() as usize);
            let c = Cluster {
                rank,
                size,
                universe: Some(universe),
                block: Default::default(),
            };
            if size > 1 {
                install_abort_on_panic(rank, size);
                if !shards {
                    c.fail(&anyhow::anyhow!(
                        "cgnmt {command} does not run as several MPI processes (train, translate, align and bench do); run it as one"
                    ));
                }
            }
            Ok(c)
        }
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// The indices of `n` items this rank takes: every `size`-th, starting at its rank (interleaved, so that a
    /// file sorted by length gives each rank a like share).
    pub fn share(&self, n: usize) -> Vec<usize> {
        (self.rank..n).step_by(self.size).collect()
    }

    /// Every rank's bytes, in rank order, at rank 0 (`None` on the other ranks); `mine` is this rank's.
    pub fn gather(&self, mine: Vec<u8>) -> Option<Vec<Vec<u8>>> {
        if self.size == 1 {
            return Some(vec![mine]);
        }
        #[cfg(feature = "mpi")]
        {
            use mpi::point_to_point::{Destination, Source};
            use mpi::traits::Communicator;
            let world = mpi::topology::SimpleCommunicator::world();
            if self.rank == 0 {
                let mut all = vec![mine];
                for r in 1..self.size {
                    let (v, _) = world.process_at_rank(r as i32).receive_vec::<u8>();
                    all.push(v);
                }
                Some(all)
            } else {
                world.process_at_rank(0).send(&mine[..]);
                None
            }
        }
        #[cfg(not(feature = "mpi"))]
        unreachable!("a job of several processes needs the mpi feature")
    }

    /// Sum `buf` over the ranks, leaving the same bits on every rank (an all-reduce may add in another order
    /// on each rank): a long vector is summed block by block, each block at one rank, then gathered by all
    /// (a reduce-scatter and an all-gather); a short one is reduced to rank 0, then broadcast from it.
    pub fn sum_f32(&self, buf: &mut [f32]) {
        if self.size > 1 {
            #[cfg(feature = "mpi")]
            {
                let mut block = self.block.borrow_mut();
                self.sum_everywhere(buf, &mut block);
            }
            #[cfg(not(feature = "mpi"))]
            self.sum_everywhere(buf, &mut vec![]);
        }
    }

    /// [`Cluster::sum_f32`] for f64 (losses, token counts, checksums).
    pub fn sum_f64(&self, buf: &mut [f64]) {
        if self.size > 1 {
            self.sum_everywhere(buf, &mut vec![]);
        }
    }

    /// Rank 0's `buf` on every rank.
    pub fn broadcast_f32(&self, buf: &mut [f32]) {
        self.broadcast(buf)
    }

    /// Rank 0's `buf` on every rank.
    pub fn broadcast_f64(&self, buf: &mut [f64]) {
        self.broadcast(buf)
    }

    /// Wait until every rank has come here.
    pub fn barrier(&self) {
        if self.size > 1 {
            #[cfg(feature = "mpi")]
            {
                use mpi::collective::CommunicatorCollectives;
                mpi::topology::SimpleCommunicator::world().barrier();
            }
            #[cfg(not(feature = "mpi"))]
            unreachable!("a job of several processes needs the mpi feature");
        }
    }

    #[cfg(feature = "mpi")]
    fn broadcast<T: mpi::datatype::Equivalence>(&self, buf: &mut [T]) {
        if self.size > 1 {
            use mpi::collective::Root;
            use mpi::traits::Communicator;
            let world = mpi::topology::SimpleCommunicator::world();
            world.process_at_rank(0).broadcast_into(buf);
        }
    }

    #[cfg(not(feature = "mpi"))]
    fn broadcast<T>(&self, _buf: &mut [T]) {
        if self.size > 1 {
            unreachable!("a job of several processes needs the mpi feature");
        }
    }

    /// (`mine`: room for this rank's block, reused.)
    #[cfg(feature = "mpi")]
    fn sum_everywhere<T: mpi::datatype::Equivalence + Copy + Default>(
        &self,
        buf: &mut [T],
        mine: &mut Vec<T>,
    ) {
        use mpi::collective::{CommunicatorCollectives, Root, SystemOperation};
        use mpi::traits::Communicator;
        let world = mpi::topology::SimpleCommunicator::world();
        let p = self.size;
        if buf.len() >= SPLIT_SUM_FROM * p && !sum_through_root() {
            // Each rank sums one block of the ranks' vectors, then every rank gathers every block: each value
            // is added up by one rank only (so every rank gets its bits), and each rank sends and receives
            // about 2(N−1)/N of the vector, half of what a reduce followed by a broadcast moves.
            let block = buf.len().div_ceil(p);
            mine.resize(block, T::default());
            if buf.len() == block * p {
                world.reduce_scatter_block_into(&buf[..], &mut mine[..], SystemOperation::sum());
                world.all_gather_into(&mine[..], buf);
            } else {
                let mut whole = vec![T::default(); block * p];
                whole[..buf.len()].copy_from_slice(buf);
                world.reduce_scatter_block_into(&whole[..], &mut mine[..], SystemOperation::sum());
                world.all_gather_into(&mine[..], &mut whole[..]);
                buf.copy_from_slice(&whole[..buf.len()]);
            }
            return;
        }
        let root = world.process_at_rank(0);
        if self.rank == 0 {
            let mut out = vec![T::default(); buf.len()];
            root.reduce_into_root(&buf[..], &mut out[..], SystemOperation::sum());
            buf.copy_from_slice(&out);
        } else {
            root.reduce_into(&buf[..], SystemOperation::sum());
        }
        root.broadcast_into(buf);
    }

    #[cfg(not(feature = "mpi"))]
    fn sum_everywhere<T>(&self, _buf: &mut [T], _mine: &mut Vec<T>) {
        unreachable!("a job of several processes needs the mpi feature")
    }

    /// End this process's part of a job that succeeded: wait for every rank, then `MPI_Finalize`, guarded
    /// against the finalize that does not return ([`finalize::guard`]).
    pub fn finish(self) {
        self.barrier();
        #[cfg(feature = "mpi")]
        {
            let mut this = self;
            if let Some(universe) = this.universe.take() {
                if this.size > 1 {
                    finalize::guard(this.rank, this.size);
                    // A test's stand-in for the hang: this rank never reaches MPI_Finalize.
                    if std::env::var("CGNMT_INJECT_FINALIZE_HANG_RANK").ok()
                        == Some(this.rank.to_string())
                    {
                        loop {
                            std::thread::sleep(std::time::Duration::from_secs(3600));
                        }
                    }
                }
                drop(universe);
            }
        }
    }

    /// Report an error of this rank and end the job: every rank stops (a job of one process just returns the
    /// error to its caller, which reports it).
    pub fn fail(&self, e: &anyhow::Error) -> ! {
        say(&format!(
            "error (rank {} of {}): {e:#}\n",
            self.rank, self.size
        ));
        self.abort(1)
    }

    fn abort(&self, code: i32) -> ! {
        #[cfg(feature = "mpi")]
        if self.size > 1 {
            use mpi::traits::Communicator;
            before_abort();
            mpi::topology::SimpleCommunicator::world().abort(code);
        }
        std::process::exit(code)
    }
}

/// A message on standard error in one write (the launcher forwards it whole, not cut after its first piece
/// when the job is torn down).
fn say(message: &str) {
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(message.as_bytes());
    let _ = err.flush();
}

/// A moment for the launcher to forward what this rank printed before `MPI_Abort` tears the job down (its
/// forwarding is asynchronous: without the pause the message's tail was lost now and then).
#[cfg(feature = "mpi")]
fn before_abort() {
    std::thread::sleep(std::time::Duration::from_millis(300));
}

/// A panic on any rank ends the job: the usual message, the rank, then `MPI_Abort`.
#[cfg(feature = "mpi")]
fn install_abort_on_panic(rank: usize, size: usize) {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        say(&format!(
            "error (rank {rank} of {size}): panicked; aborting the MPI job\n"
        ));
        before_abort();
        use mpi::traits::Communicator;
        mpi::topology::SimpleCommunicator::world().abort(101);
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_interleave_and_cover_every_line_once() {
        let mut seen = vec![];
        for rank in 0..3 {
            let c = Cluster {
                rank,
                size: 3,
                #[cfg(feature = "mpi")]
                universe: None,
                #[cfg(feature = "mpi")]
                block: Default::default(),
            };
            seen.extend(c.share(10));
        }
        seen.sort();
        assert_eq!(seen, (0..10).collect::<Vec<_>>());
        assert_eq!(Cluster::single().share(4), vec![0, 1, 2, 3]);
    }
}
