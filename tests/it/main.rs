//! End-to-end tests: real processes, real MPI, real libtorch and a real local Slurm, in one test
//! binary (one link step), one module per area. They run the binaries of their own build profile
//! (`support::bin`); `make test` builds the release binaries first, starts the local Slurm and
//! exports the environment.
//!
//! * `support`: where the binaries are, how to start ranks and `zerobench`, how to read rank logs,
//!   when a test without its environment (Slurm, pdsh) is skipped or fails.
//! * `worker`: the worker under `mpirun`: losses across stages, memory formulas, hpZ, bad flags.
//! * `models`: T5, Llama and the MLP under `mpirun`: losses across stages, learning, bf16, profiles.
//! * `rendezvous`: the worker launched torchrun-style (RANK, WORLD_SIZE, MASTER_ADDR): the same
//!   losses as under `mpirun`, bounded failure when a rank is missing or dies, bad environments.
//! * `offload`: ZeRO-Offload under `mpirun`: losses against stage 0, the device/host split.
//! * `reliability`: faults with real processes: a killed, a frozen or a signalled rank, out of
//!   memory, and the launcher and ingest on a killed rank's logs.
//! * `render`: insta snapshots of the scripts and hostfiles rendered from `slurm/examples/`.
//! * `cli`: the `zerobench` commands as a user runs them: tables, errors, exit codes.
//! * `injection`: hostile strings in every user-controlled field, rendered and run under bash.
//! * `hostlist_oracle`: the hostlist parser against `scontrol show hostnames`.
//! * `pdsh`: the pdsh method with the real pdsh (`-R exec`) and node.sh.
//! * `slurm`: against the local Slurm (`slurm/local-cluster.sh`, started by `scripts/test.sh`):
//!   `sbatch --test-only` of every example, submission, arrays, cancellation, status.
//! * `e2e_slurm`: the real worker under `srun --mpi=pmix` on one and two fake nodes.
//! * `step_time`: what a step record's times mean, on real ranks of every stage and offload.
//! * `gpu_logs`: the committed GPU logs (NCCL, copy engines) against the communication closed forms.

mod cli;
mod e2e_slurm;
mod gpu_logs;
mod hostlist_oracle;
mod injection;
mod models;
mod offload;
mod pdsh;
mod reliability;
mod render;
mod rendezvous;
mod slurm;
mod step_time;
mod support;
mod worker;
