//! Values handed to Python: NumPy arrays from the library's vectors, JSON records as Python objects, and the
//! `repr` of a result class.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

/// A NumPy array of `dtype` ("float32" or "float64") and `shape` holding `bytes` (little-endian values): a
/// copy of its own, writable.
fn array(py: Python<'_>, bytes: Vec<u8>, dtype: &str, shape: &[usize]) -> PyResult<PyObject> {
    let np = py.import("numpy")?;
    let little = if dtype == "float32" { "<f4" } else { "<f8" };
    let a = np.call_method1("frombuffer", (PyBytes::new(py, &bytes), little))?;
    let a = a.call_method1("astype", (dtype,))?;
    Ok(a.call_method1("reshape", (shape.to_vec(),))?.unbind())
}

/// A float32 array of `shape` with the values `v`.
pub fn f32_array(py: Python<'_>, v: &[f32], shape: &[usize]) -> PyResult<PyObject> {
    array(
        py,
        v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        "float32",
        shape,
    )
}

/// A float64 array of `shape` with the values `v`.
pub fn f64_array(py: Python<'_>, v: &[f64], shape: &[usize]) -> PyResult<PyObject> {
    array(
        py,
        v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        "float64",
        shape,
    )
}

/// A float64 matrix from its rows (all as long as the first).
pub fn f64_matrix(py: Python<'_>, rows: &[Vec<f64>]) -> PyResult<PyObject> {
    let cols = rows.first().map_or(0, Vec::len);
    f64_array(py, &rows.concat(), &[rows.len(), cols])
}

/// A JSON value as the Python object `json.loads` would give.
pub fn json_to_py(py: Python<'_>, v: &serde_json::Value) -> PyResult<PyObject> {
    use serde_json::Value as V;
    Ok(match v {
        V::Null => py.None(),
        V::Bool(b) => b.into_pyobject(py)?.to_owned().into_any().unbind(),
        V::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => i.into_pyobject(py)?.into_any().unbind(),
            (None, Some(u)) => u.into_pyobject(py)?.into_any().unbind(),
            _ => n
                .as_f64()
                .unwrap_or(f64::NAN)
                .into_pyobject(py)?
                .into_any()
                .unbind(),
        },
        V::String(s) => s.into_pyobject(py)?.into_any().unbind(),
        V::Array(a) => {
            let l = PyList::empty(py);
            for x in a {
                l.append(json_to_py(py, x)?)?;
            }
            l.into_any().unbind()
        }
        V::Object(o) => {
            let d = PyDict::new(py);
            for (k, x) in o {
                d.set_item(k, json_to_py(py, x)?)?;
            }
            d.into_any().unbind()
        }
    })
}

/// A JSON record's field that must be there (the library writes it).
pub fn field<'a>(v: &'a serde_json::Value, key: &str) -> PyResult<&'a serde_json::Value> {
    v.get(key).ok_or_else(|| {
        pyo3::exceptions::PyRuntimeError::new_err(format!("the library's record has no {key:?}"))
    })
}

/// A JSON record's number field.
pub fn f64_field(v: &serde_json::Value, key: &str) -> PyResult<f64> {
    field(v, key)?.as_f64().ok_or_else(|| {
        pyo3::exceptions::PyRuntimeError::new_err(format!("the library's {key:?} is not a number"))
    })
}

/// A JSON record's count field.
pub fn usize_field(v: &serde_json::Value, key: &str) -> PyResult<usize> {
    field(v, key)?.as_u64().map(|n| n as usize).ok_or_else(|| {
        pyo3::exceptions::PyRuntimeError::new_err(format!("the library's {key:?} is not a count"))
    })
}

/// `Name(field=value, ...)` from the object's attributes, as a dataclass shows itself.
pub fn repr_of(obj: &Bound<'_, PyAny>, name: &str, fields: &[&str]) -> PyResult<String> {
    let mut parts = Vec::with_capacity(fields.len());
    for f in fields {
        parts.push(format!("{f}={}", obj.getattr(*f)?.repr()?));
    }
    Ok(format!("{name}({})", parts.join(", ")))
}

/// An argument that must be a list of sentences (a single string is refused with a clear message).
pub struct Lines(pub Vec<String>);

impl<'py> FromPyObject<'py> for Lines {
    fn extract_bound(ob: &Bound<'py, PyAny>) -> PyResult<Self> {
        if ob.is_instance_of::<pyo3::types::PyString>() {
            return Err(pyo3::exceptions::PyTypeError::new_err(
                "a list of sentences, not a single string",
            ));
        }
        Ok(Lines(ob.extract()?))
    }
}

/// An argument that must be one list of phrases per sentence.
pub struct PhraseLists(pub Vec<Vec<String>>);

impl<'py> FromPyObject<'py> for PhraseLists {
    fn extract_bound(ob: &Bound<'py, PyAny>) -> PyResult<Self> {
        if ob.is_instance_of::<pyo3::types::PyString>() {
            return Err(pyo3::exceptions::PyTypeError::new_err(
                "one list of phrases per sentence, not a single string",
            ));
        }
        let lists: Vec<Lines> = ob.extract()?;
        Ok(PhraseLists(lists.into_iter().map(|l| l.0).collect()))
    }
}
