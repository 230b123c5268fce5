//! Tensors known at import time: initializers, `Constant` nodes and what folds from them
//! (shape arithmetic), decoded from ONNX's `TensorProto`.

use super::proto::{tensor_proto::DataType, TensorProto};
use tessera_core::ops::reduce::ReduceKind;

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
    /// `UINT32`.
    U32,
    /// `UINT64`.
    U64,
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
            DataType::Uint32 => Elem::U32,
            DataType::Uint64 => Elem::U64,
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
            Elem::F64 | Elem::I64 | Elem::U64 => 8,
            Elem::F32 | Elem::I32 | Elem::U32 => 4,
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
            Elem::U32 => "uint32",
            Elem::U64 => "uint64",
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
    /// Stored in an external file that is absent or empty (deliberately stripped).
    External {
        /// The file the model names.
        location: String,
    },
    /// No values at all: neither bytes nor typed data nor an external file (what a plain
    /// `onnx.load` of a weight-free file leaves).
    NoData,
    /// Replaced by a `ConstantOfShape` node (a "light" model).
    Light,
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Missing::External { location } => write!(
                f,
                "its bytes are stored in the external file `{location}`, which is absent or empty"
            ),
            Missing::NoData => write!(
                f,
                "the file holds no values for it (neither raw_data nor typed data: a weight-free copy)"
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
    let typed = t.float_data.len()
        + t.double_data.len()
        + t.int64_data.len()
        + t.uint64_data.len()
        + t.int32_data.len();
    if count > 0 && typed == 0 && t.raw_data.as_ref().is_none_or(Vec::is_empty) {
        return Err(Some(Missing::NoData));
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
                Elem::U32 => f64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                Elem::U64 => u64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f64,
                Elem::I8 => f64::from(c[0] as i8),
                Elem::U8 | Elem::Bool => f64::from(c[0]),
            })
            .collect());
    }
    let values: Vec<f64> = match elem {
        Elem::F32 => t.float_data.iter().map(|&v| f64::from(v)).collect(),
        Elem::F64 => t.double_data.clone(),
        Elem::I64 => t.int64_data.iter().map(|&v| v as f64).collect(),
        Elem::U32 | Elem::U64 => t.uint64_data.iter().map(|&v| v as f64).collect(),
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
        .map(|v| {
            if elem.is_float() {
                v
            } else {
                cast_value(v, elem)
            }
        })
        .collect();
    Some(Const::new(dims, elem, data, a.baked || b.baked))
}

/// `x` reduced over the axes marked in `reduced` by `kind`, the reduced axes kept as 1 when
/// `keep`.
pub fn reduce(x: &Const, reduced: &[bool], keep: bool, kind: ReduceKind) -> Const {
    let kept: Vec<usize> = x
        .dims
        .iter()
        .zip(reduced)
        .map(|(&d, &r)| if r { 1 } else { d })
        .collect();
    let n: usize = kept.iter().product();
    let init = if kind == ReduceKind::Max {
        f64::NEG_INFINITY
    } else {
        0.0
    };
    let mut acc = vec![init; n];
    let mut count = vec![0usize; n];
    for (i, &v) in x.data.iter().enumerate() {
        // The output position of input position i: its index with the reduced axes at 0.
        let (mut rest, mut j, mut stride) = (i, 0, 1);
        for k in (0..x.dims.len()).rev() {
            let pos = rest % x.dims[k];
            rest /= x.dims[k];
            if !reduced[k] {
                j += pos * stride;
            }
            stride *= kept[k];
        }
        acc[j] = if kind == ReduceKind::Max {
            acc[j].max(v)
        } else {
            acc[j] + v
        };
        count[j] += 1;
    }
    if kind == ReduceKind::Mean {
        for (a, &c) in acc.iter_mut().zip(&count) {
            *a /= c as f64;
        }
    }
    if kind == ReduceKind::Max {
        // The maximum of nothing: the type's least value (false for booleans).
        let least = match x.elem {
            Elem::Bool | Elem::U8 | Elem::U16 | Elem::U32 | Elem::U64 => 0.0,
            Elem::I8 => f64::from(i8::MIN),
            Elem::I16 => f64::from(i16::MIN),
            Elem::I32 => f64::from(i32::MIN),
            Elem::I64 => i64::MIN as f64,
            Elem::F32 | Elem::F16 | Elem::Bf16 | Elem::F64 => f64::NEG_INFINITY,
        };
        for (a, &c) in acc.iter_mut().zip(&count) {
            if c == 0 {
                *a = least;
            }
        }
    }
    let data = acc.into_iter().map(|v| cast_value(v, x.elem)).collect();
    let dims = if keep {
        kept
    } else {
        x.dims
            .iter()
            .zip(reduced)
            .filter(|&(_, &r)| !r)
            .map(|(&d, _)| d)
            .collect()
    };
    Const::new(dims, x.elem, data, x.baked)
}

/// The index of the greatest (`max`) or least value of `x` along `axis`, the first of equal
/// ones (the last with `last`), as int64; the axis kept as 1 when `keep`.
pub fn arg_extreme(x: &Const, axis: usize, keep: bool, max: bool, last: bool) -> Const {
    let n = x.dims[axis];
    let inner: usize = x.dims[axis + 1..].iter().product();
    let outer: usize = x.dims[..axis].iter().product();
    let mut data = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let mut best: Option<(usize, f64)> = None;
            for k in 0..n {
                let v = x.data[(o * n + k) * inner + i];
                let better = match best {
                    None => true,
                    Some((_, b)) if max => v > b || (last && v == b),
                    Some((_, b)) => v < b || (last && v == b),
                };
                if better {
                    best = Some((k, v));
                }
            }
            data.push(best.map_or(0.0, |b| b.0 as f64));
        }
    }
    let mut dims = x.dims.clone();
    if keep {
        dims[axis] = 1;
    } else {
        dims.remove(axis);
    }
    Const::new(dims, Elem::I64, data, x.baked)
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

/// Rounds a value to what an integer or boolean element type holds: integers of up to 32
/// bits wrap around their range (two's complement, as numpy and onnxruntime compute them),
/// unsigned 64-bit ones wrap below zero; int64 is held as `f64` holds it.
pub fn cast_value(v: f64, to: Elem) -> f64 {
    let wrap = |bits: i32, signed: bool| {
        let m = 2f64.powi(bits);
        let r = v.trunc().rem_euclid(m);
        if signed && r >= m / 2.0 {
            r - m
        } else {
            r
        }
    };
    match to {
        Elem::Bool => f64::from(u8::from(v != 0.0)),
        Elem::I64 => v.trunc(),
        Elem::U64 if v < 0.0 => wrap(64, false),
        Elem::U64 => v.trunc(),
        Elem::I32 => wrap(32, true),
        Elem::U32 => wrap(32, false),
        Elem::I16 => wrap(16, true),
        Elem::U16 => wrap(16, false),
        Elem::I8 => wrap(8, true),
        Elem::U8 => wrap(8, false),
        Elem::F32 | Elem::F16 | Elem::Bf16 => f64::from(v as f32),
        Elem::F64 => v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_casts_wrap_as_the_type_wraps() {
        assert_eq!(cast_value(-1.0, Elem::U8), 255.0);
        assert_eq!(cast_value(128.0, Elem::I8), -128.0);
        assert_eq!(cast_value(-2.0, Elem::U32), 4_294_967_294.0);
        assert_eq!(cast_value(2_147_483_648.0, Elem::I32), -2_147_483_648.0);
        assert_eq!(cast_value(-3.7, Elem::I16), -3.0);
        // int64 is held as it is: INT64_MAX (an "until the end" slice bound) stays positive.
        assert_eq!(cast_value(i64::MAX as f64, Elem::I64), i64::MAX as f64);
        let a = Const::new(vec![2], Elem::U32, vec![3.0, 5.0], false);
        let b = Const::new(vec![2], Elem::U32, vec![5.0, 3.0], false);
        let d = zip(&a, &b, Elem::U32, |x, y| x - y).unwrap();
        assert_eq!(d.data, vec![4_294_967_294.0, 2.0]);
    }

    #[test]
    fn reductions_fold_over_the_marked_axes() {
        let x = Const::new(
            vec![2, 3],
            Elem::F32,
            vec![1.0, 5.0, 3.0, 4.0, 2.0, 6.0],
            false,
        );
        let m = reduce(&x, &[false, true], true, ReduceKind::Max);
        assert_eq!(
            (m.dims.clone(), m.data.clone()),
            (vec![2, 1], vec![5.0, 6.0])
        );
        let s = reduce(&x, &[true, false], false, ReduceKind::Sum);
        assert_eq!(
            (s.dims.clone(), s.data.clone()),
            (vec![3], vec![5.0, 7.0, 9.0])
        );
        let a = reduce(&x, &[true, true], false, ReduceKind::Mean);
        assert_eq!((a.dims.clone(), a.data.clone()), (vec![], vec![3.5]));
        // The maximum of nothing is the type's least value.
        let e = Const::new(vec![2, 0], Elem::Bool, vec![], false);
        assert_eq!(
            reduce(&e, &[false, true], true, ReduceKind::Max).data,
            vec![0.0, 0.0]
        );
        let e = Const::new(vec![0], Elem::F32, vec![], false);
        assert_eq!(
            reduce(&e, &[true], false, ReduceKind::Max).data,
            vec![f64::NEG_INFINITY]
        );
    }

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
        // No values anywhere (a plain `onnx.load` of a weight-free file): missing, not bad.
        for raw in [None, Some(Vec::new())] {
            let t = TensorProto {
                raw_data: raw,
                ..TensorProto::default()
            };
            assert_eq!(decode(&t, Elem::F32, 6), Err(Some(Missing::NoData)));
            assert_eq!(decode(&t, Elem::F32, 0), Ok(Vec::new()));
        }
    }
}
