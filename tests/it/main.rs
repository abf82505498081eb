//! End-to-end tests: real processes, real MPI, real libtorch (and, in the launcher's modules, a
//! real local Slurm). They run the release binaries `make build` produced; `make test` builds them
//! first and exports the environment they need.

mod support;
mod reliability;
mod worker;
