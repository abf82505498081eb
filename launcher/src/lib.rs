//! Experiment specs to run folders, sbatch scripts and hostfiles; submission and tracking.
