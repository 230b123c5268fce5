//! The cost model's shape, end to end through lowering and estimation: a matmul's cycles grow
//! as its arithmetic says, fp16 is cheaper than fp32, and spreading a large element-wise op
//! over more tiles costs fewer compute cycles and more exchange; a strided convolution's and
//! pool's gradient costs its forward's work; a machine's codelets table prices its vertices.

use tessera::core::{DType, NodeId};
use tessera::sim::cost::UnaryKind;
use tessera::sim::estimate::cost_steps;
use tessera::sim::memory::{account, MemoryCategory};
use tessera::sim::op_estimates::{fully_connected, fully_connected_training, matmul, FcPass};
use tessera::sim::program::{
    exchange_for, Codelet, ComputeSet, Mapping, ProgTensor, Program, Region, Step, TensorClass,
    TensorId, TileId, Vertex, VertexType,
};
use tessera::sim::{IpuConfig, Preset};

#[test]
fn matmul_cycles_scale_with_their_arithmetic() {
    let mk2 = IpuConfig::preset(Preset::Mk2);
    // Large enough that compute dominates the fixed costs.
    let base = matmul(&mk2, 1024, 1024, 1024, DType::F16, false, false).unwrap();
    let m2 = matmul(&mk2, 2048, 1024, 1024, DType::F16, false, false).unwrap();
    let mn2 = matmul(&mk2, 2048, 1024, 2048, DType::F16, false, false).unwrap();
    let r1 = m2.compute_cycles as f64 / base.compute_cycles as f64;
    let r2 = mn2.compute_cycles as f64 / base.compute_cycles as f64;
    eprintln!(
        "compute cycles: base {}, 2m {} (x{r1:.2}), 2m2n {} (x{r2:.2})",
        base.compute_cycles, m2.compute_cycles, mn2.compute_cycles
    );
    assert!((1.6..=2.5).contains(&r1), "doubling m: x{r1}");
    assert!((3.2..=5.0).contains(&r2), "doubling m and n: x{r2}");
    for (m, k, n) in [(256, 256, 256), (1024, 512, 256), (32, 784, 256)] {
        let h = matmul(&mk2, m, k, n, DType::F16, false, false).unwrap();
        let f = matmul(&mk2, m, k, n, DType::F32, false, false).unwrap();
        assert!(
            h.compute_cycles < f.compute_cycles,
            "{m}x{k}x{n}: fp16 {} vs fp32 {}",
            h.compute_cycles,
            f.compute_cycles
        );
    }
    for pass in [FcPass::Forward, FcPass::Backward, FcPass::WeightUpdate] {
        let h = fully_connected(&mk2, 1024, 1024, 1024, 1, DType::F16, pass).unwrap();
        let f = fully_connected(&mk2, 1024, 1024, 1024, 1, DType::F32, pass).unwrap();
        assert!(h.cycles < f.cycles, "{pass:?}");
    }
}

/// `y = relu(x)` with x whole on tile 0 and y spread over `tiles` tiles.
fn spread_relu(cfg: &IpuConfig, elements: u64, tiles: u32) -> (u64, u64, u64) {
    let tensor = |name: &str, node: u32, mapping| ProgTensor {
        name: name.into(),
        node: NodeId::from_index(node),
        dtype: DType::F32,
        elements,
        mapping,
        class: TensorClass::NotAlwaysLive,
        live: (0, 1),
        interleaved: false,
    };
    let x = tensor("x", 0, Mapping::single(elements, TileId(0)));
    let y = tensor(
        "y",
        1,
        Mapping::linear(elements, 1, 1, TileId(0), tiles, cfg.tiles),
    );
    let vertices: Vec<Vertex> = y
        .mapping
        .intervals()
        .iter()
        .map(|iv| Vertex {
            tile: iv.tile,
            codelet: Codelet::Unary(VertexType::of(1, DType::F32)),
            cycles: UnaryKind::Relu.cycles(cfg, iv.len, DType::F32),
            reads: vec![Region::span(TensorId(0), iv.start, iv.len)],
            writes: vec![Region::span(TensorId(1), iv.start, iv.len)],
        })
        .collect();
    let tensors = vec![x, y];
    let transfers = exchange_for(&tensors, &vertices);
    let mut steps = Vec::new();
    if !transfers.is_empty() {
        steps.push(Step::Exchange {
            node: NodeId::from_index(1),
            transfers,
        });
    }
    steps.push(Step::Compute(ComputeSet::new(
        "y/op".into(),
        NodeId::from_index(1),
        vertices,
    )));
    let n = steps.len();
    let program = Program {
        tiles: cfg.tiles,
        tensors,
        steps,
        node_steps: vec![(0, 0), (0, n)],
        shared_steps: Vec::new(),
        exchange_keys: Vec::new(),
        calls: 0,
        call_clones: Vec::new(),
        node_names: vec!["x".into(), "y".into()],
        forward_nodes: 2,
    };
    tessera::sim::check::check(&program).unwrap();
    let (c, bytes, _) = cost_steps(&program, cfg, 0..n);
    (c.compute, c.exchange, bytes)
}

#[test]
fn spreading_an_elementwise_op_trades_compute_for_exchange() {
    let mk2 = IpuConfig::preset(Preset::Mk2);
    let mut last: Option<(u64, u64, u64)> = None;
    for tiles in [1, 4, 16, 64, 256] {
        let (compute, exchange, bytes) = spread_relu(&mk2, 1 << 16, tiles);
        eprintln!(
            "{tiles} tiles: compute {compute}, exchange {exchange} cycles, {bytes} bytes moved"
        );
        if let Some((c0, x0, b0)) = last {
            assert!(compute < c0, "{tiles} tiles: compute {compute} >= {c0}");
            assert!(
                exchange > x0 && bytes > b0,
                "{tiles} tiles: exchange {exchange} <= {x0}"
            );
        }
        last = Some((compute, exchange, bytes));
    }
}

/// A program of one tensor on tile 0, `bytes` of interleaved data and `other` bytes of other
/// data, both live at step 0.
fn interleaved_program(interleaved: u64, other: u64) -> Program {
    let tensor = |name: &str, node: u32, elements: u64, interleaved: bool| ProgTensor {
        name: name.into(),
        node: NodeId::from_index(node),
        dtype: DType::U8,
        elements,
        mapping: Mapping::single(elements, TileId(0)),
        class: TensorClass::Temporary,
        live: (0, 0),
        interleaved,
    };
    Program {
        tiles: 4,
        tensors: vec![
            tensor("partials", 0, interleaved, true),
            tensor("other", 1, other, false),
        ],
        steps: vec![],
        node_steps: vec![(0, 0), (0, 0)],
        shared_steps: Vec::new(),
        exchange_keys: Vec::new(),
        calls: 0,
        call_clones: Vec::new(),
        node_names: vec!["partials".into(), "other".into()],
        forward_nodes: 2,
    }
}

#[test]
fn interleaved_data_leaves_a_gap_below_it() {
    let mk1 = IpuConfig::preset(Preset::Mk1);
    let start = mk1.interleaved_region_start_bytes;
    assert_eq!(start, 131_072);
    // A few partials on an otherwise small tile: used up to the region's start plus them.
    let r = account(&interleaved_program(96, 1_000), &mk1);
    let t = &r.tiles[0];
    assert_eq!(t.interleaved, 96);
    assert_eq!(t.total(), start + 96);
    assert_eq!(t.gaps, t.total() - t.data_bytes());
    assert_eq!(t.get(MemoryCategory::Gaps), t.gaps);
    // The gaps are not data: the report's total leaves them out.
    assert_eq!(
        r.total_bytes(),
        r.tiles.iter().map(|t| t.total() - t.gaps).sum::<u64>()
    );
    // Other data above the region's start fills the gap: no gap is left.
    let r = account(&interleaved_program(96, 200_000), &mk1);
    assert_eq!(r.tiles[0].gaps, 0);
    // No interleaved data, no gap, even on a tile far below the region.
    let r = account(&interleaved_program(0, 1_000), &mk1);
    assert_eq!(r.tiles[0].gaps, 0);
    // A machine whose whole SRAM is interleaved has no gaps.
    let mut flat = mk1.clone();
    flat.interleaved_region_start_bytes = 0;
    let r = account(&interleaved_program(96, 1_000), &flat);
    assert_eq!(r.tiles[0].gaps, 0);
}

#[test]
fn a_trained_layer_planned_jointly_keeps_its_passes_on_the_weights_tiles() {
    // 1 x 1000 -> 5: planned alone, the weight update spreads its 5,000 products over more
    // tiles (each with its code and stack) and moves the gradient to the weights; planned
    // with its layer it runs on the forward's tiles and writes the gradient beside them.
    let mk1 = IpuConfig::preset(Preset::Mk1);
    let alone = fully_connected(&mk1, 1, 1000, 5, 1, DType::F32, FcPass::WeightUpdate).unwrap();
    let layer = fully_connected_training(&mk1, 1, 1000, 5, 1, DType::F32).unwrap();
    let names: Vec<&str> = layer.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["fc forward", "fc backward", "fc weight update"]);
    for pass in &layer {
        assert!(pass.cycles > 0 && pass.fits, "{pass:?}");
        // One program: the layer's memory, the same in every pass.
        assert_eq!(pass.total_memory_bytes, layer[0].total_memory_bytes);
        assert_eq!(pass.tiles_used, layer[0].tiles_used);
        let by_category: u64 = pass.memory_by_category.values().sum();
        assert_eq!(by_category, pass.total_memory_bytes);
    }
    assert!(
        layer[0].tiles_used < alone.tiles_used,
        "{} tiles for the layer, {} for its weight update alone",
        layer[0].tiles_used,
        alone.tiles_used
    );
    assert!(layer[0].total_memory_bytes < alone.total_memory_bytes);
}

#[test]
fn a_small_amp_product_fills_its_tile_up_to_the_interleaved_region() {
    // The IPU Model reports about 131 KB (Mk1) and 213 KB (Mk2) on the fullest tile of even
    // tiny AMP products: their partials sit in the interleaved region.
    for preset in [Preset::Mk1, Preset::Mk2] {
        let cfg = IpuConfig::preset(preset);
        let e = fully_connected(&cfg, 4, 1000, 5, 1, DType::F32, FcPass::Forward).unwrap();
        let start = cfg.interleaved_region_start_bytes;
        assert!(
            e.max_tile_bytes > start && e.max_tile_bytes < start + 4_096,
            "{preset}: fullest tile {} B",
            e.max_tile_bytes
        );
        // Total memory counts no gaps: far less than a gap per tile used.
        assert!(
            e.total_memory_bytes < e.tiles_used as u64 * start / 8,
            "{preset}: {e:?}"
        );
    }
}

/// Compute cycles of the nodes `pick` selects, from a training estimate's stage traces.
fn traced_cycles(
    g: &tessera::core::Graph<tessera::sim::Heap>,
    e: &tessera::sim::system::SystemEstimate,
    pick: &dyn Fn(&tessera::core::Op) -> bool,
) -> u64 {
    use tessera::sim::estimate::Phase;
    let names: Vec<&str> = g
        .nodes()
        .iter()
        .filter(|n| pick(n.op()))
        .map(|n| n.name())
        .collect();
    assert!(!names.is_empty());
    e.stages
        .iter()
        .flat_map(|s| s.forward_trace.iter().chain(&s.backward_trace))
        .filter(|ev| ev.phase == Phase::Compute && names.contains(&ev.op.as_str()))
        .map(|ev| ev.cycles)
        .sum()
}

/// The input gradient of a stride-2 convolution and of a stride-2 max pool is the forward's
/// work in reverse: poplin computes only the input positions on the stride's grid for each
/// kernel position (`getNumberOfMACs`), and popnn's pooling gradient walks the forward's
/// windows. So each costs about its forward (the pool's at popnn's 5/3 per vector), not the
/// stride's square times it.
#[test]
fn strided_gradients_cost_the_forwards_work_not_the_strides_square() {
    use tessera::core::ops::conv::{Conv, ConvParams, DataLayout, Padding};
    use tessera::core::ops::pool::{Pool, PoolKind, PoolParams};
    use tessera::core::{Accumulation, Graph, Init, Op, Optimizer, Plan};
    use tessera::sim::system::{estimate_system, SystemOptions};
    let mut g: Graph<tessera::sim::Heap> = Graph::new();
    let x = g.input("x", &[8, 64, 56, 56], DType::F16).unwrap();
    let w0 = g
        .variable("w0", &[64, 64, 3, 3], DType::F16, Init::GlorotUniform)
        .unwrap();
    let p1 = ConvParams::new(DataLayout::Nchw).pads([1, 1, 1, 1]);
    let h = g
        .conv2d("c0", x, w0, p1, Padding::Explicit(p1.pads))
        .unwrap();
    let pool = PoolParams {
        kind: PoolKind::Max,
        layout: DataLayout::Nchw,
        kernel: [3, 3],
        stride: [2, 2],
        pads: [1, 1, 1, 1],
    };
    let h = g
        .pool2d("pool", h, pool, Padding::Explicit(pool.pads))
        .unwrap();
    let w1 = g
        .variable("w1", &[128, 64, 3, 3], DType::F16, Init::GlorotUniform)
        .unwrap();
    let p2 = ConvParams::new(DataLayout::Nchw)
        .stride(2, 2)
        .pads([1, 1, 1, 1]);
    let y = g
        .conv2d("c1", h, w1, p2, Padding::Explicit(p2.pads))
        .unwrap();
    let loss = g.reduce_sum("loss", y, None).unwrap();
    g.differentiate_accumulating(loss, Optimizer::sgd(0.1), Accumulation::new(1))
        .unwrap();
    let plan = Plan::new(&g).unwrap();
    let cfg = IpuConfig::preset(Preset::Mk2);
    let opts = SystemOptions {
        schedule: tessera::core::schedule::Schedule::Sequential,
        ..SystemOptions::default()
    };
    let e = estimate_system(&plan, &cfg, &opts).unwrap();
    let strided = |op: &Op| matches!(op, Op::Conv(c) if c.params().stride == [2, 2]);
    let forward = traced_cycles(&g, &e, &|op| {
        strided(op) && matches!(op, Op::Conv(Conv::Forward { .. }))
    });
    let grad_input = traced_cycles(&g, &e, &|op| {
        strided(op) && matches!(op, Op::Conv(Conv::GradInput { .. }))
    });
    let ratio = grad_input as f64 / forward as f64;
    assert!(
        (0.5..2.0).contains(&ratio),
        "input gradient {grad_input} cycles, forward {forward}: {ratio:.2}x"
    );
    let pool_fwd = traced_cycles(&g, &e, &|op| matches!(op, Op::Pool(Pool::Forward { .. })));
    let pool_bwd = traced_cycles(&g, &e, &|op| matches!(op, Op::Pool(Pool::Backward { .. })));
    let ratio = pool_bwd as f64 / pool_fwd as f64;
    assert!(
        (1.3..2.2).contains(&ratio),
        "pool gradient {pool_bwd} cycles, forward {pool_fwd}: {ratio:.2}x"
    );
}

#[test]
fn a_machine_prices_its_vertices_by_its_own_codelets_table() {
    let mk2 = IpuConfig::preset(Preset::Mk2);
    let mut other = mk2.clone();
    other.codelets.amp_supervisor += 1_000;
    other.codelets.compute_set_overhead += 1_000;
    let a = matmul(&mk2, 256, 256, 256, DType::F16, false, false).unwrap();
    let b = matmul(&other, 256, 256, 256, DType::F16, false, false).unwrap();
    assert!(b.cycles > a.cycles, "{} vs {}", b.cycles, a.cycles);
    // A machine written without its table reads the Colossus one, every preset's.
    let mut json = serde_json::to_value(&mk2).unwrap();
    json.as_object_mut().unwrap().remove("codelets");
    let read: IpuConfig = serde_json::from_value(json).unwrap();
    assert_eq!(read, mk2);
}

/// A select between two branches, as an ONNX `If` decided at run time imports: memory holds
/// both, the cycles (forward, backward) only the dearer branch's, and the estimate says which.
#[test]
fn a_run_time_conditional_costs_its_dearer_branch_and_holds_both() {
    use tessera::core::{Activation, Graph, Optimizer, Plan};
    use tessera::sim::system::{estimate_system, Conditional, SystemOptions};
    use tessera::sim::Heap;
    let mut g: Graph<Heap> = Graph::new();
    let x = g.input("x", &[64, 128], DType::F32).unwrap();
    let cond = g.input("cond", &[64, 1], DType::U8).unwrap();
    let labels = g.input("labels", &[64], DType::I32).unwrap();
    let start = g.len();
    let a = g
        .dense("then/a", x, 512, Activation::Relu, DType::F32)
        .unwrap();
    let a = g
        .dense("then/b", a, 128, Activation::Linear, DType::F32)
        .unwrap();
    let middle = g.len();
    let b = g
        .dense("else/a", x, 128, Activation::Linear, DType::F32)
        .unwrap();
    let end = g.len();
    let y = g.select("y", cond, a, b).unwrap();
    let logits = g
        .dense("classifier", y, 10, Activation::Linear, DType::F32)
        .unwrap();
    let loss = g
        .sparse_categorical_crossentropy("loss", logits, labels, true)
        .unwrap();
    g.differentiate(loss, Optimizer::sgd(0.1)).unwrap();
    let plan = Plan::new(&g).unwrap();
    let mk2 = IpuConfig::preset(Preset::Mk2);
    let both = SystemOptions {
        micro_batch: 64,
        schedule: tessera::core::schedule::Schedule::Sequential,
        ..SystemOptions::default()
    };
    let one = SystemOptions {
        conditionals: vec![Conditional {
            name: "y".into(),
            branches: [start..middle, middle..end],
        }],
        ..both.clone()
    };
    let (e2, e1) = (
        estimate_system(&plan, &mk2, &both).unwrap(),
        estimate_system(&plan, &mk2, &one).unwrap(),
    );
    assert!(e2.conditionals.is_empty());
    let c = &e1.conditionals[0];
    assert_eq!(c.assumed, "then");
    assert!(c.then_cycles > c.else_cycles && c.else_cycles > 0, "{c:?}");
    let pass = |e: &tessera::sim::system::SystemEstimate| {
        e.stages[0].forward_cycles + e.stages[0].backward_cycles
    };
    assert_eq!(pass(&e2) - pass(&e1), c.else_cycles);
    assert_eq!(e2.ipus[0].bytes_used, e1.ipus[0].bytes_used);
    assert!(e1.cycles_per_weight_update < e2.cycles_per_weight_update);
}
