//! zerobench's end-to-end tests: one binary (one link step), one module per area.
//!
//! * `common`: finding the binaries, the local Slurm, temp folders.
//! * `render`: insta snapshots of the scripts and hostfiles rendered from `slurm/examples/`.
//! * `cli`: the `zerobench` commands as a user runs them: tables, errors, exit codes.
//! * `injection`: hostile strings in every user-controlled field, rendered and run under bash.
//! * `hostlist_oracle`: the hostlist parser against `scontrol show hostnames`.
//! * `slurm`: against the real local Slurm (`slurm/local-cluster.sh`, started by
//!   `scripts/test.sh`): `sbatch --test-only` of every example, submission, arrays, status.
//! * `e2e_slurm`: the real worker under `srun --mpi=pmix` on one and two fake nodes.

mod cli;
mod common;
mod e2e_slurm;
mod hostlist_oracle;
mod injection;
mod render;
mod slurm;
