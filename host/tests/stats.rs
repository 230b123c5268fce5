//! Tensor-inspection statistics end to end: the exact text of the key list and the table, NaN
//! and infinity flags, the empty case, and a table built from tensors drained from an outfeed.

use std::collections::BTreeMap;

use tessera_host::outfeed::{Element, OutfeedMode, OutfeedQueue};
use tessera_host::stats::{format_keys, format_table, TensorStats, NO_DATA};
use tessera_host::tensor::HostTensor;

fn t(shape: &[usize], data: &[f32]) -> HostTensor {
    HostTensor::new(shape.to_vec(), data.to_vec()).unwrap()
}

fn map(entries: Vec<(&str, HostTensor)>) -> BTreeMap<String, HostTensor> {
    entries
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
}

#[test]
fn table_for_known_values_is_exact() {
    let m = map(vec![
        ("loss", t(&[], &[0.5])),
        ("Dense_128/bias:0_grad", t(&[4], &[1.0, 2.0, 3.0, 4.0])),
    ]);
    let expected = [
        "Index                   Name      Mean       Std   Minimum   Maximum   NaNs   infs",
        "    0  Dense_128/bias:0_grad  2.500000  1.118034  1.000000  4.000000  False  False",
        "    1                   loss  0.500000  0.000000  0.500000  0.500000  False  False",
    ]
    .join("\n");
    assert_eq!(format_table(&m), expected);
}

#[test]
fn table_widens_columns_for_negative_and_large_values() {
    let m = map(vec![("w", t(&[2], &[-1000.25, 3000.75]))]);
    let expected = [
        "Index  Name         Mean          Std       Minimum      Maximum   NaNs   infs",
        "    0     w  1000.250000  2000.500000  -1000.250000  3000.750000  False  False",
    ]
    .join("\n");
    assert_eq!(format_table(&m), expected);
}

#[test]
fn nan_and_inf_are_reported_true() {
    let m = map(vec![
        ("a_nan", t(&[3], &[1.0, f32::NAN, 2.0])),
        ("b_inf", t(&[3], &[1.0, f32::INFINITY, 2.0])),
        ("c_both", t(&[2], &[f32::NEG_INFINITY, f32::NAN])),
        ("d_neg_inf", t(&[2], &[f32::NEG_INFINITY, 0.0])),
        ("e_fine", t(&[2], &[0.0, 1.0])),
    ]);
    let table = format_table(&m);
    let rows: Vec<Vec<&str>> = table
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows,
        vec![
            vec!["0", "a_nan", "nan", "nan", "nan", "nan", "True", "False"],
            vec!["1", "b_inf", "inf", "nan", "1.000000", "inf", "False", "True"],
            vec!["2", "c_both", "nan", "nan", "nan", "nan", "True", "True"],
            vec![
                "3",
                "d_neg_inf",
                "-inf",
                "nan",
                "-inf",
                "0.000000",
                "False",
                "True"
            ],
            vec!["4", "e_fine", "0.500000", "0.500000", "0.000000", "1.000000", "False", "False"],
        ]
    );
    // Every line has the same width: the columns are aligned.
    let widths: Vec<usize> = table.lines().map(str::len).collect();
    assert!(widths.windows(2).all(|w| w[0] == w[1]), "{table}");

    let s = TensorStats::of(&m["a_nan"]);
    assert!(s.has_nan && !s.has_inf && s.mean.is_nan());
    let s = TensorStats::of(&m["b_inf"]);
    assert!(!s.has_nan && s.has_inf);
    assert_eq!((s.min, s.max), (1.0, f64::INFINITY));
}

#[test]
fn empty_map_says_no_data() {
    let m = BTreeMap::new();
    assert_eq!(format_table(&m), "No data enqueued");
    assert_eq!(NO_DATA, "No data enqueued");
    assert_eq!(format_keys(&m), "");
}

#[test]
fn key_lines_use_python_tuples() {
    let m = map(vec![
        (
            "Dense_128/bias:0_grad",
            HostTensor::filled(vec![125, 128], 0.0).unwrap(),
        ),
        ("Dense_10/bias:0", t(&[5], &[0.0; 5])),
        ("loss", HostTensor::scalar(1.0)),
    ]);
    assert_eq!(
        format_keys(&m),
        "key: Dense_10/bias:0 shape: (5,)\n\
         key: Dense_128/bias:0_grad shape: (125, 128)\n\
         key: loss shape: ()"
    );
}

#[test]
fn statistics_of_an_outfeed_drain() {
    // A training loop taps a gradient for 125 steps; the host drains and summarises it.
    let q = OutfeedQueue::new("grads", OutfeedMode::All, 255, 1).unwrap();
    for step in 0..125 {
        let mut m = BTreeMap::new();
        let g: Vec<f32> = (0..128).map(|i| (step * 128 + i) as f32).collect();
        m.insert("Dense_128/bias:0_grad".to_owned(), t(&[128], &g));
        q.enqueue(vec![Element::Map(m)]).unwrap();
    }
    let drained = q.dequeue().unwrap().into_map().unwrap();
    assert_eq!(
        format_keys(&drained),
        "key: Dense_128/bias:0_grad shape: (125, 128)"
    );
    // Values 0 .. 16000: mean 7999.5, population std sqrt((16000^2 - 1) / 12).
    let std = ((16000f64 * 16000.0 - 1.0) / 12.0).sqrt();
    let table = format_table(&drained);
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(
        row,
        [
            "0",
            "Dense_128/bias:0_grad",
            "7999.500000",
            &format!("{std:.6}"),
            "0.000000",
            "15999.000000",
            "False",
            "False"
        ]
    );
}
