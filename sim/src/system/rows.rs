//! The estimate's rows: one per IPU and one per stage.

use rayon::prelude::*;
use tessera_core::{Plan, Roles, Storage};

use super::phases::{system_lower_options, Costs, Memory, Run};
use super::stash::{stash_per_tile, Stash};
use super::{IpuRow, StageRow};
use crate::memory::{account_part, OutOfMemory, PartMemory, TileMemory};
use crate::program::TensorClass;

/// Each IPU's row, and the worst tile over the limit (with what it holds), if any.
pub(super) fn ipu_rows<S: Storage>(
    run: &Run<'_, S>,
    tl: &crate::pipeline::Timeline,
    memory: &Memory,
    costs: &mut Costs,
    node_code: &mut [Vec<crate::memory::NodeCode>],
) -> (Vec<IpuRow>, Option<OutOfMemory>) {
    let Run {
        plan,
        cfg,
        opts,
        t,
        programs,
        summaries,
        ..
    } = run;
    let g = plan.graph();
    let mut worst: Option<OutOfMemory> = None;
    // Which variables' state replicated tensor sharding divides (the same on every IPU).
    let lower = system_lower_options(opts);
    let rows = (0..t.ipus)
        .map(|d| {
            let r = &memory.reports[d];
            let fullest = r.fullest(10).into_iter().cloned().collect::<Vec<_>>();
            if let Some(tile) = fullest
                .first()
                .filter(|tile| tile.total() > cfg.sram_bytes_per_tile)
            {
                if worst.as_ref().is_none_or(|w| tile.total() > w.needed) {
                    worst = crate::memory::check_fits_with(programs[d], summaries[d], r)
                        .err()
                        .map(|b| *b);
                }
            }
            let streaming: u64 = programs[d]
                .tensors
                .iter()
                .zip(g.nodes())
                .filter(|(t, n)| {
                    t.class == TensorClass::NotAlwaysLive
                        && ((n.roles().contains(Roles::OPTIMIZER_STATE)
                            && opts.techniques.offload.optimizer_state)
                            || (n.roles().contains(Roles::ACCUMULATOR)
                                && opts.techniques.offload.gradient_accumulators))
                })
                .map(|(t, n)| {
                    let shards = if n.roles().contains(Roles::OPTIMIZER_STATE) {
                        lower.shards_of(t.elements)
                    } else {
                        1
                    };
                    (t.elements * t.elem_bytes()).div_ceil(shards)
                })
                .sum::<u64>()
                + memory.offloaded_stash[d];
            IpuRow {
                ipu: d,
                stages: (0..t.s).filter(|&k| t.mapping[k] == d).collect(),
                busy_cycles: tl.ipus[d].busy,
                idle_cycles: tl.ipus[d].idle,
                idle_fraction: tl.ipus[d].idle_fraction(),
                weight_update_cycles: costs.update[d].total(),
                bytes_used: r.total_bytes(),
                max_tile_bytes: r.tiles.iter().map(TileMemory::total).max().unwrap_or(0),
                tiles_used: r.tiles_used(),
                stash_bytes: memory.stash_bytes[d],
                streaming_memory_bytes: streaming,
                fullest_tiles: fullest,
                categories: TileMemory::sum(&r.tiles),
                tiles: r.tiles.clone(),
                update_trace: std::mem::take(&mut costs.update_traces[d]),
                vertices: programs[d].vertex_count(),
                node_code: std::mem::take(&mut node_code[d]),
            }
        })
        .collect();
    (rows, worst)
}

/// Each stage's row: its cycles, stash, traces and, when it shares its IPU, its own memory
/// over its own steps.
pub(super) fn stage_rows<S: Storage>(
    run: &Run<'_, S>,
    tl: &crate::pipeline::Timeline,
    stash: &Stash,
    costs: Costs,
) -> Vec<StageRow>
where
    Plan<S>: Sync,
    tessera_core::Graph<S>: Sync,
{
    let Run {
        plan,
        cfg,
        opts,
        t,
        programs,
        summaries,
        ..
    } = run;
    let g = plan.graph();
    let (s, mapping) = (t.s, &t.mapping);
    // The memory of each stage that shares its IPU, over its own steps.
    let stage_memory: Vec<Option<PartMemory>> = (0..s)
        .into_par_iter()
        .map(|k| {
            let d = mapping[k];
            if !opts.memory || (0..s).filter(|&j| mapping[j] == d).count() < 2 {
                return None;
            }
            let mut part = vec![false; programs[d].steps.len()];
            for (i, n) in g.nodes().iter().enumerate() {
                if n.stage() == k {
                    let (a, b) = programs[d].node_steps[i];
                    part[a..b].iter_mut().for_each(|x| *x = true);
                }
            }
            let mut r = account_part(programs[d], summaries[d], cfg, Some(&part));
            // Its own stash, as its IPU's holds it.
            if !stash.offloaded {
                let depth = t.entries[k] as u64;
                for &(_, i) in stash.stashed.iter().filter(|&&(j, _)| j == k) {
                    for (tile, bytes) in stash_per_tile(&programs[d].tensors[i], depth) {
                        r.tiles[tile].stash += bytes;
                    }
                }
            }
            r.settle_gaps();
            Some(PartMemory {
                categories: TileMemory::sum(&r.tiles),
                bytes_used: r.total_bytes(),
                max_tile_bytes: r.tiles.iter().map(TileMemory::total).max().unwrap_or(0),
            })
        })
        .collect();
    let Costs {
        stages: cycles,
        phases,
        traces,
        ..
    } = costs;
    (0..s)
        .zip(traces)
        .zip(stage_memory)
        .map(|((k, (forward_trace, backward_trace)), memory)| StageRow {
            stage: k,
            position: t.positions[k],
            ipu: mapping[k],
            forward_cycles: cycles[k].forward,
            backward_cycles: cycles[k].backward,
            stash_depth: t.entries[k],
            stash_entry_bytes: stash.entry_bytes[k],
            idle_fraction: tl.ipus[mapping[k]].idle_fraction(),
            forward_phases: phases[k].0,
            backward_phases: phases[k].1,
            forward_trace,
            backward_trace,
            memory,
        })
        .collect()
}
