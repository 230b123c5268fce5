//! Tensors known at import time: initializers, `Constant` nodes and what folds from them
//! (shape arithmetic), decoded from ONNX's `TensorProto`.

use super::proto::{tensor_proto::DataType, TensorProto};

/// ONNX element types the importer reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    /// `FLOAT`.
    F32,
    /// `FLOAT16`.
    F16,
    /// `BFLOAT16`.
    Bf16,
    /// `DOUBLE`.
    F64,
    /// `INT64`.
    I64,
    /// `INT32`.
    I32,
    /// `INT16`.
    I16,
    /// `UINT16`.
    U16,
    /// `INT8`.
    I8,
    /// `UINT8`.
    U8,
    /// `BOOL`.
    Bool,
}

impl Elem {
    /// The element type of ONNX's `DataType` code, if the importer reads it.
    pub fn from_code(code: i32) -> Option<Elem> {
        Some(match DataType::try_from(code).ok()? {
            DataType::Float => Elem::F32,
            DataType::Float16 => Elem::F16,
            DataType::Bfloat16 => Elem::Bf16,
            DataType::Double => Elem::F64,
            DataType::Int64 => Elem::I64,
            DataType::Int32 => Elem::I32,
            DataType::Int16 => Elem::I16,
            DataType::Uint16 => Elem::U16,
            DataType::Int8 => Elem::I8,
            DataType::Uint8 => Elem::U8,
            DataType::Bool => Elem::Bool,
            _ => return None,
        })
    }

    /// Whether values are floating point.
    pub fn is_float(self) -> bool {
        matches!(self, Elem::F32 | Elem::F16 | Elem::Bf16 | Elem::F64)
    }

    /// Bytes per element in ONNX's raw encoding.
    pub fn size(self) -> usize {
        match self {
            Elem::F64 | Elem::I64 => 8,
            Elem::F32 | Elem::I32 => 4,
            Elem::F16 | Elem::Bf16 | Elem::I16 | Elem::U16 => 2,
            Elem::I8 | Elem::U8 | Elem::Bool => 1,
        }
    }

    /// ONNX's name of the type.
    pub fn name(self) -> &'static str {
        match self {
            Elem::F32 => "float",
            Elem::F16 => "float16",
            Elem::Bf16 => "bfloat16",
            Elem::F64 => "double",
            Elem::I64 => "int64",
            Elem::I32 => "int32",
            Elem::I16 => "int16",
            Elem::U16 => "uint16",
            Elem::I8 => "int8",
            Elem::U8 => "uint8",
            Elem::Bool => "bool",
        }
    }
}

/// The name of an ONNX `DataType` code, for messages.
pub fn code_name(code: i32) -> String {
    DataType::try_from(code).map_or_else(
        |_| format!("type {code}"),
        |t| t.as_str_name().to_lowercase(),
    )
}

/// A tensor whose values are known at import time. Values are held as `f64` whatever the
/// element type (shape arithmetic is integers far below 2^53; float constants are small).
#[derive(Clone, Debug, PartialEq)]
pub struct Const {
    /// Dimensions.
    pub dims: Vec<usize>,
    /// Element type.
    pub elem: Elem,
    /// Values, row-major.
    pub data: Vec<f64>,
    /// Whether the values come from the file as written (initializers, `Constant` nodes,
    /// arithmetic on them) rather than from `Shape` of a tensor: a shape written into the
    /// file was exported at the file's batch size and is rebound when the batch changes.
    pub baked: bool,
    /// Whether the tensor stands for a weight of a "light" model (a float
    /// `ConstantOfShape` of a written shape: a weight whose values were dropped).
    pub light: bool,
}

impl Const {
    /// A constant of the given values.
    pub fn new(dims: Vec<usize>, elem: Elem, data: Vec<f64>, baked: bool) -> Const {
        Const {
            dims,
            elem,
            data,
            baked,
            light: false,
        }
    }

    /// A rank-1 `int64` constant (a shape).
    pub fn ints(values: &[i64], baked: bool) -> Const {
        Const::new(
            vec![values.len()],
            Elem::I64,
            values.iter().map(|&v| v as f64).collect(),
            baked,
        )
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// The values as integers (truncated).
    pub fn as_ints(&self) -> Vec<i64> {
        self.data.iter().map(|&v| v as i64).collect()
    }

    /// The single value of a one-element tensor.
    pub fn scalar(&self) -> Option<f64> {
        (self.data.len() == 1).then(|| self.data[0])
    }

    /// Whether every element is the same (a fill).
    pub fn uniform(&self) -> Option<f64> {
        let first = *self.data.first()?;
        self.data
            .iter()
            .all(|&v| v.to_bits() == first.to_bits())
            .then_some(first)
    }
}

/// Why an initializer's values could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Missing {
    /// Stored in an external file that is absent (or deliberately stripped).
    External {
        /// The file the model names.
        location: String,
    },
    /// Replaced by a `ConstantOfShape` node (a "light" model).
    Light,
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Missing::External { location } => write!(
                f,
                "its bytes are stored in the external file `{location}`, which is not there"
            ),
            Missing::Light => write!(
                f,
                "it is a ConstantOfShape placeholder (a weight-free \"light\" model)"
            ),
        }
    }
}

/// The values of `t` as `f64`, or why they are not in the file. `Err(None)` means the
/// encoding is not one the importer reads (a message is made by the caller).
pub fn decode(t: &TensorProto, elem: Elem, count: usize) -> Result<Vec<f64>, Option<Missing>> {
    if t.data_location == Some(1) || !t.external_data.is_empty() {
        let location = t
            .external_data
            .iter()
            .find(|e| e.key.as_deref() == Some("location"))
            .and_then(|e| e.value.clone())
            .unwrap_or_default();
        return Err(Some(Missing::External { location }));
    }
    if let Some(raw) = &t.raw_data {
        if raw.len() != count * elem.size() {
            return Err(None);
        }
        return Ok(raw
            .chunks_exact(elem.size())
            .map(|c| match elem {
                Elem::F32 => f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                Elem::F64 => f64::from_le_bytes(c.try_into().unwrap_or([0; 8])),
                Elem::F16 => f64::from(tessera_core::f16::f16_to_f32(u16::from_le_bytes([
                    c[0], c[1],
                ]))),
                Elem::Bf16 => f64::from(f32::from_bits(
                    u32::from(u16::from_le_bytes([c[0], c[1]])) << 16,
                )),
                Elem::I64 => i64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f64,
                Elem::I32 => f64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                Elem::I16 => f64::from(i16::from_le_bytes([c[0], c[1]])),
                Elem::U16 => f64::from(u16::from_le_bytes([c[0], c[1]])),
                Elem::I8 => f64::from(c[0] as i8),
                Elem::U8 | Elem::Bool => f64::from(c[0]),
            })
            .collect());
    }
    let values: Vec<f64> = match elem {
        Elem::F32 => t.float_data.iter().map(|&v| f64::from(v)).collect(),
        Elem::F64 => t.double_data.clone(),
        Elem::I64 => t.int64_data.iter().map(|&v| v as f64).collect(),
        // int32_data carries int32, int16, uint16, int8, uint8, bool, and float16 / bfloat16
        // bit patterns.
        Elem::I32 | Elem::I16 | Elem::U16 | Elem::I8 | Elem::U8 | Elem::Bool => {
            t.int32_data.iter().map(|&v| f64::from(v)).collect()
        }
        Elem::F16 => t
            .int32_data
            .iter()
            .map(|&v| f64::from(tessera_core::f16::f16_to_f32(v as u16)))
            .collect(),
        Elem::Bf16 => t
            .int32_data
            .iter()
            .map(|&v| f64::from(f32::from_bits((v as u32 & 0xffff) << 16)))
            .collect(),
    };
    if values.len() == count {
        Ok(values)
    } else {
        Err(None)
    }
}

/// Row-major strides of `dims`.
pub fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// numpy broadcasting of two shapes.
pub fn broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let r = a.len().max(b.len());
    let mut out = vec![0; r];
    for (i, o) in out.iter_mut().enumerate() {
        let da = if i + a.len() >= r {
            a[i + a.len() - r]
        } else {
            1
        };
        let db = if i + b.len() >= r {
            b[i + b.len() - r]
        } else {
            1
        };
        *o = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

/// The flat index into a tensor of `dims` (broadcast into `out`) of output position `flat`.
fn broadcast_index(dims: &[usize], out: &[usize], flat: usize) -> usize {
    let r = out.len();
    let mut rem = flat;
    let mut idx = 0;
    let mut stride = 1;
    for i in (0..r).rev() {
        let pos = rem % out[i];
        rem /= out[i];
        if i + dims.len() >= r {
            let d = dims[i + dims.len() - r];
            if d != 1 {
                idx += pos * stride;
            }
            stride *= d;
        }
    }
    idx
}

/// Element-wise `f` of constants with numpy broadcasting; `elem` is the result's type.
pub fn zip(a: &Const, b: &Const, elem: Elem, f: impl Fn(f64, f64) -> f64) -> Option<Const> {
    let dims = broadcast(&a.dims, &b.dims)?;
    let n: usize = dims.iter().product();
    let data = (0..n)
        .map(|i| {
            f(
                a.data[broadcast_index(&a.dims, &dims, i)],
                b.data[broadcast_index(&b.dims, &dims, i)],
            )
        })
        .collect();
    Some(Const::new(dims, elem, data, a.baked || b.baked))
}

/// `x` broadcast to `dims` (numpy rules).
pub fn expand(x: &Const, dims: &[usize]) -> Option<Const> {
    let out = broadcast(&x.dims, dims)?;
    let n: usize = out.iter().product();
    let data = (0..n)
        .map(|i| x.data[broadcast_index(&x.dims, &out, i)])
        .collect();
    Some(Const::new(out, x.elem, data, x.baked))
}

/// Rounds a value to what an integer or boolean element type holds.
pub fn cast_value(v: f64, to: Elem) -> f64 {
    match to {
        Elem::Bool => f64::from(u8::from(v != 0.0)),
        Elem::I64 | Elem::I32 | Elem::I16 | Elem::U16 | Elem::I8 | Elem::U8 => v.trunc(),
        Elem::F32 | Elem::F16 | Elem::Bf16 => f64::from(v as f32),
        Elem::F64 => v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_follows_numpy() {
        assert_eq!(broadcast(&[2, 1, 3], &[4, 1]), Some(vec![2, 4, 3]));
        assert_eq!(broadcast(&[2], &[3]), None);
        let a = Const::new(vec![2, 1], Elem::I64, vec![1.0, 2.0], true);
        let b = Const::new(vec![3], Elem::I64, vec![10.0, 20.0, 30.0], false);
        let c = zip(&a, &b, Elem::I64, |x, y| x + y).unwrap();
        assert_eq!(c.dims, vec![2, 3]);
        assert_eq!(c.data, vec![11.0, 21.0, 31.0, 12.0, 22.0, 32.0]);
        assert!(c.baked);
    }

    #[test]
    fn raw_and_typed_encodings_decode() {
        let t = TensorProto {
            raw_data: Some([1i64, -2].iter().flat_map(|v| v.to_le_bytes()).collect()),
            ..TensorProto::default()
        };
        assert_eq!(decode(&t, Elem::I64, 2), Ok(vec![1.0, -2.0]));
        let t = TensorProto {
            float_data: vec![0.5, 1.5, 2.5],
            ..TensorProto::default()
        };
        assert_eq!(decode(&t, Elem::F32, 3), Ok(vec![0.5, 1.5, 2.5]));
        assert_eq!(decode(&t, Elem::F32, 4), Err(None));
    }
}
