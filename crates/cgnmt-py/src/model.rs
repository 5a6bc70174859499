//! `Model`: a model directory read for its description (configuration, parameter counts, vocabularies)
//! without decoding anything.

use std::path::PathBuf;

use pyo3::prelude::*;

use crate::convert::json_to_py;
use crate::errors::{guarded, py_err};

/// The tokens of a vocabulary by id.
pub fn vocabulary(v: &cgnmt_data::vocab::Vocab) -> Vec<String> {
    (0..v.len() as u32)
        .map(|i| v.token(i).unwrap_or_default().to_string())
        .collect()
}

/// A model's description as a dict: `directory`, `config` (TOML), `parameters` (per component),
/// `total_parameters` and the vocabularies' sizes.
pub fn model_info(py: Python<'_>, m: &cgnmt::LoadedModel) -> PyResult<PyObject> {
    let counts = cgnmt::model::init::count_by_component(&m.varmap);
    let total: usize = counts.iter().map(|(_, n)| n).sum();
    let v = serde_json::json!({
        "directory": m.dir.to_string_lossy(),
        "config": m.config.to_toml(),
        "parameters": counts,
        "total_parameters": total,
        "source_vocabulary_size": m.src_vocab.len(),
        "target_vocabulary_size": m.tgt_vocab.len(),
    });
    let d = json_to_py(py, &v)?;
    // Parameter counts as (component, count) tuples.
    let pairs: Vec<(String, usize)> = counts;
    d.bind(py).set_item("parameters", pairs)?;
    Ok(d)
}

/// A model directory, read for its description (no decoding): `Model(dir).info()`, its `config` (TOML text),
/// `directory`, and its vocabularies (`source_vocabulary`, `target_vocabulary`: the tokens by id, `</s>` and
/// `<unk>` first).
#[pyclass(frozen, get_all, module = "cgnmt")]
pub struct Model {
    pub directory: String,
    pub config: String,
    pub source_vocabulary: Vec<String>,
    pub target_vocabulary: Vec<String>,
    info: PyObject,
}

#[pymethods]
impl Model {
    #[new]
    fn new(py: Python<'_>, model_dir: PathBuf) -> PyResult<Self> {
        let m = py.allow_threads(|| {
            guarded(|| {
                let dir = cgnmt::model::store::resolve_model_dir(&model_dir);
                cgnmt::model::store::load(&dir, candle_core::DType::F32, &candle_core::Device::Cpu)
                    .map_err(py_err)
            })
        })?;
        Ok(Model {
            directory: m.dir.to_string_lossy().into_owned(),
            config: m.config.to_toml(),
            source_vocabulary: vocabulary(&m.src_vocab),
            target_vocabulary: vocabulary(&m.tgt_vocab),
            info: model_info(py, &m)?,
        })
    }

    /// `directory`, `config` (TOML), `parameters` (per component), `total_parameters` and the vocabularies'
    /// sizes.
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.info.bind(py).call_method0("copy")
    }

    fn __repr__(&self) -> String {
        format!("Model({:?})", self.directory)
    }
}
