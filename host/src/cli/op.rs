//! `tessera estimate-op` and `tessera dataset-benchmark`.

use std::collections::BTreeMap;

use crate::calibration::{self, Table};
use crate::dataset::Dataset;
use crate::infeed::dataset_benchmark;
use crate::whole_models;
use serde::Serialize;
use tessera_sim::machine::IpuConfig;
use tessera_sim::op_estimates::{
    convolution, fully_connected, fully_connected_training, matmul, ConvLayer, ConvPass, FcPass,
    OpEstimate,
};

use super::args::{BenchArgs, CalibrateArgs, OpCommand, OpCommon, ShapeArg};
use super::options::{data_dir, load_data};
use super::AnyError;

/// The JSON `estimate-op` prints.
#[derive(Serialize)]
struct OpJson<'a> {
    cycles: u64,
    total_memory_bytes: u64,
    max_tile_bytes: u64,
    fits: bool,
    passes: BTreeMap<&'a str, &'a OpEstimate>,
}

fn estimates(c: OpCommand) -> Result<(OpCommon, Vec<OpEstimate>), AnyError> {
    Ok(match c {
        OpCommand::Matmul {
            m,
            k,
            n,
            transpose_a,
            transpose_b,
            common,
        } => {
            let cfg = IpuConfig::preset(common.ipu);
            let dtype = common.data_type.dtype();
            let r = matmul(&cfg, m, k, n, dtype, transpose_a, transpose_b)?;
            (common, vec![r])
        }
        OpCommand::Fc {
            batch_size,
            input_size,
            output_size,
            num_groups,
            inference_only,
            common,
        } => {
            let cfg = IpuConfig::preset(common.ipu);
            let dtype = common.data_type.dtype();
            let (b, i, o, g) = (batch_size, input_size, output_size, num_groups);
            let rs = if inference_only {
                vec![fully_connected(&cfg, b, i, o, g, dtype, FcPass::Forward)?]
            } else {
                fully_connected_training(&cfg, b, i, o, g, dtype)?
            };
            (common, rs)
        }
        OpCommand::Conv {
            field,
            kernel_size,
            input_channels,
            output_channels,
            stride,
            padding,
            conv_groups,
            batch_size,
            bias,
            inference_only,
            common,
        } => {
            let layer = conv_layer(
                &field,
                &kernel_size,
                &stride,
                &padding,
                [input_channels, output_channels, conv_groups, batch_size],
                bias,
            )?;
            let cfg = IpuConfig::preset(common.ipu);
            let passes: &[ConvPass] = if inference_only {
                &[ConvPass::Forward]
            } else {
                &[
                    ConvPass::Forward,
                    ConvPass::Backward,
                    ConvPass::WeightUpdate,
                ]
            };
            let dtype = common.data_type.dtype();
            let rs = passes
                .iter()
                .map(|&p| convolution(&cfg, &layer, dtype, p))
                .collect::<Result<Vec<_>, _>>()?;
            (common, rs)
        }
    })
}

/// The layer the `conv` options describe. A 1-D field is a 2-D one of height 1 (its kernel,
/// stride and padding given for the width; a single value applies to both dimensions).
fn conv_layer(
    field: &ShapeArg,
    kernel: &ShapeArg,
    stride: &ShapeArg,
    padding: &ShapeArg,
    [in_channels, out_channels, groups, batch]: [usize; 4],
    bias: bool,
) -> Result<ConvLayer, AnyError> {
    let one_d = field.0.len() == 1;
    let two = |what: &str, s: &ShapeArg, flat: usize| -> Result<[usize; 2], AnyError> {
        Ok(match (s.0.as_slice(), one_d) {
            (&[v], true) => [flat, v],
            (&[v], false) => [v, v],
            (&[a, b], false) => [a, b],
            _ => {
                return Err(format!(
                    "--{what} has {} sizes but --field has {}",
                    s.0.len(),
                    field.0.len()
                )
                .into())
            }
        })
    };
    Ok(ConvLayer {
        batch,
        in_channels,
        out_channels,
        groups,
        field: two("field", field, 1)?,
        kernel: two("kernel-size", kernel, 1)?,
        stride: two("stride", stride, 1)?,
        padding: two("padding", padding, 0)?,
        bias,
    })
}

pub fn run_op(c: OpCommand) -> Result<bool, AnyError> {
    let (common, results) = estimates(c)?;
    let figures = calibration::Figures::of_passes(&results);
    let json = OpJson {
        cycles: figures.cycles,
        total_memory_bytes: figures.total_memory_bytes,
        max_tile_bytes: figures.max_tile_bytes,
        fits: results.iter().all(|r| r.fits),
        passes: results.iter().map(|r| (r.name.as_str(), r)).collect(),
    };
    if common.json {
        println!("{}", serde_json::to_string(&json)?);
    } else {
        for r in &results {
            println!(
                "{}: {} cycles (compute {}, exchange {}), {} flops, memory {} bytes, fullest tile {} bytes on {} tiles{}",
                r.name,
                r.cycles,
                r.compute_cycles,
                r.exchange_cycles,
                r.flops,
                r.total_memory_bytes,
                r.max_tile_bytes,
                r.tiles_used,
                if r.fits { "" } else { " (DOES NOT FIT)" }
            );
            let by_category: Vec<String> = r
                .memory_by_category
                .iter()
                .map(|(c, b)| format!("{c} {b}"))
                .collect();
            println!("  memory by category: {}", by_category.join(", "));
        }
        println!("total: {} cycles", json.cycles);
    }
    Ok(json.fits)
}

pub fn run_calibrate(a: CalibrateArgs) -> Result<bool, AnyError> {
    let c = calibration::calibrate(a.file.as_deref(), a.whole_models.as_deref(), a.ops_only)?;
    if a.json {
        println!("{}", serde_json::to_string(&c)?);
    } else {
        println!("{}", Table(&c.rows));
        if c.breaks.is_empty() {
            println!("within the bounds (median |error| 15% / 15% / 25%, no row 2x off in cycles)");
        } else {
            for b in &c.breaks {
                println!("outside the bounds: {b}");
            }
        }
        let (runs, profiles) = (&c.published_runs, &c.profiles);
        if !runs.is_empty() {
            println!();
            print!("{}", whole_models::RunTable(runs));
        }
        if !profiles.is_empty() {
            println!();
            println!("Poplar's memory by category (MB = 10^6 bytes, one IPU):");
            print!("{}", whole_models::ProfileTable(profiles));
        }
        if !runs.is_empty() || !profiles.is_empty() {
            println!();
            if c.whole_model_breaks.is_empty() {
                println!("whole models within the bounds (runs fit and within 10%, a host-inclusive figure 1.0x-1.1x; profile categories within 25%, total and fullest tile within 10%)");
            }
            for b in &c.whole_model_breaks {
                println!("outside the whole-model bounds: {b}");
            }
        }
    }
    Ok(!a.check || c.within_bounds())
}

pub fn run_bench(a: BenchArgs) -> Result<bool, AnyError> {
    if a.batch_size == 0 {
        return Err("--batch-size: must be at least 1".into());
    }
    let data = load_data(&data_dir(a.data.as_deref()))?;
    let ds = Dataset::from_mnist_split(&data.train_images, &data.train_labels)?
        .map("images", |x| x / 255.0)?
        .shuffle(a.seed)?
        .batch(a.batch_size, true)?;
    let report = dataset_benchmark(&ds, a.epochs)?;
    println!("{}", report.to_json());
    Ok(true)
}
