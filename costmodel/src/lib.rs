//! zerobench's cost model: step time and peak GPU memory of a ZeRO configuration, fitted from
//! logged runs and predicted for configurations nobody has run.
//!
//! * [`work`]: what a configuration asks of the machine (FLOPs, activations, kernels, parameters
//!   updated where, bytes on the wire), exact from the schema's shapes and formulas;
//! * [`terms`]: the model's formula, a coefficient per term;
//! * [`price`]: the formula evaluated against coefficients;
//! * [`nnls`]: non-negative least squares, which fits them;
//! * [`observation`]: a measured run as the fit takes it;
//! * [`coefficients`]: the staged fit of one GPU kind's coefficients;
//! * [`mod@fit`]: one fit per GPU kind and precision, with its ranges and validation;
//! * [`validate`]: k-fold validation over configurations;
//! * [`model`]: the versioned model file and prediction from it.
//!
//! docs/cost-model.md states the terms, how they were fitted and validated, and where the model
//! fails.

pub mod coefficients;
pub mod fit;
pub mod model;
pub mod nnls;
pub mod observation;
pub mod price;
pub mod terms;
pub mod validate;
pub mod work;

pub use fit::{fit, FitError, Fitted};
pub use model::{CostModel, Fit, IntervalOf, ModelError, Prediction};
pub use observation::Observation;
pub use price::{sharing_factor, Bound, DeviceDonor, OFFLOAD_SHARING};
pub use work::Query;

/// The models shipped with zerobench: fitted on the committed GPU sweeps
/// (`bench/results/raw/gpu-*-costmodel.tar.gz`, docs/cost-model.md), so `zerobench predict --gpu`
/// works without fitting.
const SHIPPED: &[(&str, &str)] = &[
    ("costmodel/models/h200.json", include_str!("../models/h200.json")),
    ("costmodel/models/h100.json", include_str!("../models/h100.json")),
];

/// Every shipped fit, in one model.
pub fn shipped() -> Result<CostModel, ModelError> {
    let mut all = CostModel { format: model::FORMAT.to_string(), version: model::VERSION, fits: Vec::new() };
    for (origin, text) in SHIPPED {
        all.fits.extend(CostModel::from_json(origin, text)?.fits);
    }
    Ok(all)
}
