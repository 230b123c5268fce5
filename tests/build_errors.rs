//! Build errors are typed values naming the node, never panics.

use proptest::prelude::*;
use tessera::core::ops::elementwise::BinaryFn;
use tessera::core::{Activation, DType, Fixed, Graph, GraphError, Init, Optimizer, Plan, RunError};

#[test]
fn wrong_shapes_name_the_node() {
    let mut g: Graph<Fixed<32>> = Graph::new();
    let x = g.input("x", &[4, 3], DType::F32).unwrap();
    let w = g.variable("w", &[5, 2], DType::F32, Init::Zeros).unwrap();
    let e = g.matmul("Dense/MatMul", x, w).unwrap_err();
    assert!(
        matches!(&e, GraphError::ShapeMismatch { node, .. } if node == "Dense/MatMul"),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "`Dense/MatMul` (MatMul): inner dimensions must agree, got (4, 3) and (5, 2)"
    );
    let b = g.variable("b", &[7], DType::F32, Init::Zeros).unwrap();
    assert!(matches!(
        g.bias_add("ba", x, b),
        Err(GraphError::ShapeMismatch { .. })
    ));
    let y = g.input("y", &[3, 4], DType::F32).unwrap();
    assert!(matches!(
        g.add("sum", x, y),
        Err(GraphError::ShapeMismatch { .. })
    ));
    let e = g.reshape("r", x, &[5]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "`r`: cannot reshape (4, 3) (12 elements) to (5,) (5 elements)"
    );
    assert!(matches!(
        g.reduce_sum("rs", x, Some(2)),
        Err(GraphError::BadAxis {
            axis: 2,
            rank: 2,
            ..
        })
    ));
    assert!(matches!(
        g.input("z", &[0, 3], DType::F32),
        Err(GraphError::BadShape { .. })
    ));
    assert!(matches!(
        g.input("big", &[1, 2, 3, 4, 5, 6, 7], DType::F32),
        Err(GraphError::BadShape { .. })
    ));
    let labels = g.input("labels", &[5], DType::I32).unwrap();
    assert!(matches!(
        g.sparse_categorical_crossentropy("loss", x, labels, false),
        Err(GraphError::ShapeMismatch { .. })
    ));
    let flabels = g.input("flabels", &[4], DType::F32).unwrap();
    assert!(matches!(
        g.sparse_categorical_crossentropy("loss", x, flabels, false),
        Err(GraphError::DTypeMismatch { .. })
    ));
    let e = g
        .dense("Dense_8", labels, 8, Activation::Relu, DType::F32)
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("`Dense_8` (Dense): input must be at least rank 2"),
        "{e}"
    );
}

#[test]
fn unknown_and_duplicate_names() {
    let mut g: Graph<Fixed<16>> = Graph::new();
    g.input("x", &[2, 2], DType::F32).unwrap();
    let e = g.relu("r", "nope").unwrap_err();
    assert_eq!(
        e,
        GraphError::UnknownName {
            name: "nope".try_into().unwrap()
        }
    );
    assert_eq!(e.to_string(), "no node is named `nope`");
    let e = g.relu("x", "x").unwrap_err();
    assert_eq!(e.to_string(), "a node named `x` already exists");
    assert!(matches!(g.relu("", "x"), Err(GraphError::BadName { .. })));
    assert!(matches!(
        g.relu(&"n".repeat(200), "x"),
        Err(GraphError::BadName { .. })
    ));
    // An id from a bigger graph.
    let mut other: Graph<Fixed<16>> = Graph::new();
    for i in 0..5 {
        other.input(&format!("i{i}"), &[1], DType::F32).unwrap();
    }
    let foreign = other.find("i4").unwrap();
    assert!(matches!(
        g.relu("r", foreign),
        Err(GraphError::UnknownNode { index: 4 })
    ));
}

#[test]
fn capacity_and_training_errors() {
    let mut g: Graph<Fixed<3>> = Graph::new();
    g.input("a", &[1], DType::F32).unwrap();
    g.relu("b", "a").unwrap();
    g.relu("c", "b").unwrap();
    let e = g.relu("d", "c").unwrap_err();
    assert_eq!(
        e,
        GraphError::CapacityExceeded {
            node: "d".try_into().unwrap(),
            capacity: 3
        }
    );

    let mut g: Graph<Fixed<64>> = Graph::new();
    let x = g.input("x", &[2, 2], DType::F32).unwrap();
    let s = g.reduce_sum("s", x, None).unwrap();
    assert!(matches!(
        g.clone().differentiate(s, Optimizer::sgd(0.1)),
        Err(GraphError::NothingToTrain { .. })
    ));
    assert!(matches!(
        g.clone().differentiate(x, Optimizer::sgd(0.1)),
        Err(GraphError::BadLoss { .. })
    ));
    assert!(matches!(
        g.clone().differentiate(s, Optimizer::sgd(-1.0)),
        Err(GraphError::BadHyperParameter {
            name: "learning_rate",
            ..
        })
    ));
    assert!(matches!(
        g.clone().differentiate(s, Optimizer::momentum(0.1, 1.5)),
        Err(GraphError::BadHyperParameter {
            name: "momentum",
            ..
        })
    ));
    let y = g.dense("D", x, 2, Activation::Linear, DType::F32).unwrap();
    // Gradient ops have no gradient of their own (no second derivatives).
    let r = g.binary("r", y, y, BinaryFn::ReluGrad).unwrap();
    let m = g.reduce_max("m", r, None).unwrap();
    let e = g.clone().differentiate(m, Optimizer::sgd(0.1)).unwrap_err();
    assert_eq!(e.to_string(), "`r`: no gradient is defined for ReluGrad");
    let l = g.reduce_mean("l", y, None).unwrap();
    g.differentiate(l, Optimizer::sgd(0.1)).unwrap();
    assert_eq!(
        g.clone().differentiate(l, Optimizer::sgd(0.1)),
        Err(GraphError::AlreadyTraining)
    );
}

#[test]
fn run_errors_name_the_tensor() {
    let mut g: Graph<Fixed<32>> = Graph::new();
    let x = g.input("x", &[2, 3], DType::F32).unwrap();
    let labels = g.input("labels", &[2], DType::I32).unwrap();
    let y = g.dense("D", x, 3, Activation::Linear, DType::F32).unwrap();
    g.sparse_categorical_crossentropy("loss", y, labels, true)
        .unwrap();
    let plan = Plan::new(&g).unwrap();
    let mut arena = vec![0u8; plan.arena_bytes()];
    let state = vec![0u8; plan.state_bytes()];
    assert!(matches!(
        plan.write_input("x", &mut arena, &[1.0]),
        Err(RunError::WrongLength {
            expected: 6,
            supplied: 1,
            ..
        })
    ));
    assert!(matches!(
        plan.write_input("D/kernel:0", &mut arena, &[0.0; 9]),
        Err(RunError::WrongKind { .. })
    ));
    assert!(matches!(
        plan.write_input("nope", &mut arena, &[0.0]),
        Err(RunError::UnknownTensor { .. })
    ));
    assert!(matches!(
        plan.infer(&mut arena[..1], &state),
        Err(RunError::ArenaTooSmall { .. })
    ));
    plan.write_input("labels", &mut arena, &[1.0, 7.0]).unwrap();
    let e = plan.infer(&mut arena, &state).unwrap_err();
    assert_eq!(e.to_string(), "`loss`: label 7 in row 1 is outside 0..3");
    let mut st = state.clone();
    assert_eq!(
        plan.train_step(&mut arena, &mut st),
        Err(RunError::NotATrainingPlan)
    );
}

#[derive(Clone, Debug)]
enum Call {
    Input(String, Vec<usize>),
    Variable(String, Vec<usize>),
    MatMul(String, String, String, bool, bool),
    Add(String, String, String),
    BiasAdd(String, String, String),
    Relu(String, String),
    Softmax(String, String),
    Reshape(String, String, Vec<usize>),
    Reduce(String, String, Option<usize>),
    Dense(String, String, usize),
    Loss(String, String, String),
    Flatten(String, String),
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("a".to_string()),
        Just("b".to_string()),
        Just("c".to_string()),
        "[a-z]{0,3}",
        ".{0,60}"
    ]
}

fn dims() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(0usize..5, 0..6)
}

fn call() -> impl Strategy<Value = Call> {
    prop_oneof![
        (name(), dims()).prop_map(|(n, d)| Call::Input(n, d)),
        (name(), dims()).prop_map(|(n, d)| Call::Variable(n, d)),
        (name(), name(), name(), any::<bool>(), any::<bool>())
            .prop_map(|(n, a, b, x, y)| Call::MatMul(n, a, b, x, y)),
        (name(), name(), name()).prop_map(|(n, a, b)| Call::Add(n, a, b)),
        (name(), name(), name()).prop_map(|(n, a, b)| Call::BiasAdd(n, a, b)),
        (name(), name()).prop_map(|(n, a)| Call::Relu(n, a)),
        (name(), name()).prop_map(|(n, a)| Call::Softmax(n, a)),
        (name(), name(), dims()).prop_map(|(n, a, d)| Call::Reshape(n, a, d)),
        (name(), name(), prop::option::of(0usize..6)).prop_map(|(n, a, x)| Call::Reduce(n, a, x)),
        (name(), name(), 0usize..5).prop_map(|(n, a, u)| Call::Dense(n, a, u)),
        (name(), name(), name()).prop_map(|(n, a, b)| Call::Loss(n, a, b)),
        (name(), name()).prop_map(|(n, a)| Call::Flatten(n, a)),
    ]
}

proptest! {
    /// Any sequence of builder calls with any names, shapes and operands returns Ok or a typed
    /// error; afterwards planning, differentiating and running never panic either.
    #[test]
    fn arbitrary_builder_calls_never_panic(calls in prop::collection::vec(call(), 0..30), dt in prop_oneof![Just(DType::F32), Just(DType::F16), Just(DType::I32)]) {
        let mut g: Graph<Fixed<24>> = Graph::new();
        let mut last_loss = None;
        for c in calls {
            let r = match &c {
                Call::Input(n, d) => g.input(n, d, dt),
                Call::Variable(n, d) => g.variable(n, d, dt, Init::GlorotUniform),
                Call::MatMul(n, a, b, x, y) => g.matmul_t(n, a.as_str(), b.as_str(), *x, *y),
                Call::Add(n, a, b) => g.add(n, a.as_str(), b.as_str()),
                Call::BiasAdd(n, a, b) => g.bias_add(n, a.as_str(), b.as_str()),
                Call::Relu(n, a) => g.relu(n, a.as_str()),
                Call::Softmax(n, a) => g.softmax(n, a.as_str()),
                Call::Reshape(n, a, d) => g.reshape(n, a.as_str(), d),
                Call::Reduce(n, a, x) => g.reduce_mean(n, a.as_str(), *x),
                Call::Dense(n, a, u) => g.dense(n, a.as_str(), *u, Activation::Relu, dt),
                Call::Loss(n, a, b) => g.sparse_categorical_crossentropy(n, a.as_str(), b.as_str(), true),
                Call::Flatten(n, a) => g.flatten(n, a.as_str()),
            };
            if let (Ok(id), Call::Loss(..)) = (&r, &c) {
                last_loss = Some(*id);
            }
            if let Err(e) = r {
                prop_assert!(!e.to_string().is_empty());
            }
        }
        if let Some(loss) = last_loss {
            let _ = g.differentiate(loss, Optimizer::adam(0.01));
        }
        let plan = Plan::new(&g).unwrap();
        let mut arena = vec![0u8; plan.arena_bytes()];
        let mut state = vec![0u8; plan.state_bytes()];
        plan.init_state(&mut state, 0).unwrap();
        let _ = plan.infer(&mut arena, &state);
        let _ = plan.train_step(&mut arena, &mut state);
    }
}

#[test]
fn a_failed_differentiation_leaves_the_graph_as_it_was() {
    // Room for the forward pass but not the backward.
    let mut g: Graph<Fixed<12>> = Graph::new();
    let x = g.input("x", &[2, 3], DType::F32).unwrap();
    let labels = g.input("labels", &[2], DType::I32).unwrap();
    let y = g.dense("D", x, 2, Activation::Linear, DType::F32).unwrap();
    let loss = g
        .sparse_categorical_crossentropy("loss", y, labels, true)
        .unwrap();
    let before = g.clone();
    assert!(matches!(
        g.differentiate(loss, Optimizer::sgd(0.1)),
        Err(GraphError::CapacityExceeded { .. })
    ));
    assert_eq!(g, before);
    assert!(!g.is_training());
}

#[test]
fn stages_follow_scopes_and_reach_the_backward_pass() {
    let mut g: Graph<Fixed<64>> = Graph::new();
    let x = g.input("x", &[2, 3], DType::F32).unwrap();
    let labels = g.input("labels", &[2], DType::I32).unwrap();
    let h = g.dense("D1", x, 4, Activation::Relu, DType::F32).unwrap();
    g.set_stage(1).unwrap();
    let y = g.dense("D2", h, 2, Activation::Linear, DType::F32).unwrap();
    let loss = g
        .sparse_categorical_crossentropy("loss", y, labels, true)
        .unwrap();
    g.differentiate(loss, Optimizer::sgd(0.1)).unwrap();
    assert_eq!(g.stage_count(), 2);
    let stage = |name: &str| g.node(g.find(name).unwrap()).stage();
    assert_eq!(stage("D1/kernel:0"), 0);
    assert_eq!(stage("D2/kernel:0"), 1);
    assert_eq!(stage("D1/kernel:0_grad"), 0);
    assert_eq!(stage("D2/kernel:0_grad"), 1);
    assert_eq!(stage("D1/kernel:0/update"), 0);
    assert!(matches!(
        g.set_stage(300),
        Err(GraphError::BadStage { stage: 300 })
    ));
}

#[test]
fn bad_shapes_of_the_new_ops_name_the_layer() {
    use tessera::core::ops::conv::{ConvParams, DataLayout, Padding};
    use tessera::core::ops::elementwise::BinaryFn;
    let mut g: Graph<Fixed<64>> = Graph::new();
    let x = g.input("x", &[1, 3, 5, 5], DType::F32).unwrap();
    // A kernel larger than its padded input.
    let big = g
        .variable("big", &[4, 3, 7, 7], DType::F32, Init::Zeros)
        .unwrap();
    let p = ConvParams::new(DataLayout::Nchw);
    let e = g.conv2d("conv_big", x, big, p, Padding::Valid).unwrap_err();
    assert!(matches!(e, GraphError::ShapeMismatch { .. }), "{e}");
    assert!(
        e.to_string().starts_with("`conv_big` (Conv): the kernel"),
        "{e}"
    );
    // Channels that do not match the weights.
    let w = g
        .variable("w", &[4, 2, 3, 3], DType::F32, Init::Zeros)
        .unwrap();
    let e = g
        .conv2d("conv_channels", x, w, p, Padding::Same)
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("`conv_channels` (Conv): channels must match"),
        "{e}"
    );
    // Groups that do not divide the channels.
    let w3 = g
        .variable("w3", &[4, 1, 3, 3], DType::F32, Init::Zeros)
        .unwrap();
    let e = g
        .conv2d("conv_groups", x, w3, p.groups(2), Padding::Same)
        .unwrap_err();
    assert!(e.to_string().starts_with("`conv_groups` (Conv)"), "{e}");
    // A bad permutation.
    let e = g.transpose("perm", x, &[0, 1, 1, 3]).unwrap_err();
    assert!(matches!(e, GraphError::BadAttribute { .. }), "{e}");
    assert!(
        e.to_string()
            .starts_with("`perm` (Transpose): perm must list"),
        "{e}"
    );
    let e = g.transpose("perm_rank", x, &[0, 1, 2]).unwrap_err();
    assert!(e.to_string().starts_with("`perm_rank` (Transpose)"), "{e}");
    // An axis out of range.
    let e = g.softmax_axis("soft", x, 4).unwrap_err();
    assert_eq!(e.to_string(), "`soft`: axis 4 is out of range for rank 4");
    let e = g.softmax_axis("soft_neg", x, -5).unwrap_err();
    assert_eq!(
        e.to_string(),
        "`soft_neg`: axis -5 is out of range for rank 4"
    );
    let e = g
        .reduce(
            "red",
            x,
            &[7],
            false,
            tessera::core::ops::reduce::ReduceKind::Sum,
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            GraphError::BadAxis {
                axis: 7,
                rank: 4,
                ..
            }
        ),
        "{e}"
    );
    // A pair that does not broadcast.
    let a = g.input("a", &[2, 3], DType::F32).unwrap();
    let b = g.input("b", &[3, 2], DType::F32).unwrap();
    let e = g.binary("sum", a, b, BinaryFn::Add).unwrap_err();
    assert_eq!(
        e.to_string(),
        "`sum` (Add): operands must broadcast (numpy rules), got (2, 3) and (3, 2)"
    );
    // A pooling window larger than its padded input.
    use tessera::core::ops::pool::{PoolKind, PoolParams};
    let pp = PoolParams::new(PoolKind::Max, DataLayout::Nchw, [6, 6], [1, 1]);
    let e = g.pool2d("pool", x, pp, Padding::Valid).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("`pool` (MaxPool): the window is larger"),
        "{e}"
    );
    // Batched matmuls whose batch axes do not broadcast.
    let m1 = g.input("m1", &[2, 3, 4], DType::F32).unwrap();
    let m2 = g.input("m2", &[3, 4, 5], DType::F32).unwrap();
    let e = g.matmul("mm", m1, m2).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("`mm` (MatMul): batch dimensions must broadcast"),
        "{e}"
    );
    // The graph is unchanged by the failures: every name above is still free.
    assert!(g.find("conv_big").is_err() && g.find("sum").is_err());
}
