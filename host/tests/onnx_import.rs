//! ONNX import of the bundled real models: every file imports, and the inferred shape of
//! every tensor equals the file's own `value_info` (and graph outputs).

use std::path::PathBuf;

use tessera_core::{DType, Graph};
use tessera_host::onnx::{import, ImportOptions, OnnxModel, Stages};
use tessera_sim::Heap;

fn models() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data/onnx");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("data/onnx")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "onnx"))
        .collect();
    v.sort();
    assert!(v.len() >= 7, "the bundled models are missing");
    v
}

fn dims_of(v: &tessera_host::onnx::proto::ValueInfoProto) -> Option<Vec<usize>> {
    use tessera_host::onnx::proto::tensor_shape_proto::dimension::Value as D;
    use tessera_host::onnx::proto::type_proto::Value as T;
    let Some(T::TensorType(t)) = v.r#type.as_ref()?.value.as_ref() else {
        return None;
    };
    t.shape
        .as_ref()?
        .dim
        .iter()
        .map(|d| match d.value {
            Some(D::DimValue(x)) => Some(x as usize),
            _ => None,
        })
        .collect()
}

#[test]
fn inferred_shapes_equal_the_files_value_info() {
    for path in models() {
        let m = OnnxModel::load(&path).expect("loads");
        let mut g: Graph<Heap> = Graph::new();
        let imp = import(&m, &mut g, &ImportOptions::default())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let graph = m.graph();
        let mut checked = 0;
        for vi in graph.value_info.iter().chain(&graph.output) {
            let name = vi.name.clone().unwrap_or_default();
            let Some(want) = dims_of(vi) else { continue };
            let got = imp
                .shapes
                .get(&name)
                .unwrap_or_else(|| panic!("{}: no shape for `{name}`", path.display()));
            assert_eq!(got, &want, "{}: tensor `{name}`", path.display());
            checked += 1;
        }
        // Files without value_info: ONNX's own shape inference, committed as JSON.
        let stem = path
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .split('.')
            .next()
            .unwrap();
        let reference = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/onnx_shapes")
            .join(format!("{stem}.json"));
        if let Ok(text) = std::fs::read_to_string(&reference) {
            let want: std::collections::BTreeMap<String, Vec<usize>> =
                serde_json::from_str(&text).expect("reference shapes");
            for (name, dims) in want {
                // Tensors folded at import still have their shapes recorded.
                let got = imp
                    .shapes
                    .get(&name)
                    .unwrap_or_else(|| panic!("{}: no shape for `{name}`", path.display()));
                assert_eq!(got, &dims, "{}: tensor `{name}`", path.display());
                checked += 1;
            }
        }
        assert!(checked >= graph.output.len());
        println!(
            "{}: {} nodes -> {} graph nodes, {checked} shapes checked",
            path.display(),
            graph.node.len(),
            g.len()
        );
    }
}

#[test]
fn training_import_and_rebound_batch() {
    for path in models() {
        let m = OnnxModel::load(&path).expect("loads");
        for batch in [1, 4] {
            let mut g: Graph<Heap> = Graph::new();
            let opts = ImportOptions {
                batch_size: Some(batch),
                dtype: DType::F16,
                training: true,
                stages: Stages::One,
                ..ImportOptions::default()
            };
            let imp = import(&m, &mut g, &opts)
                .unwrap_or_else(|e| panic!("{} at batch {batch}: {e}", path.display()));
            for i in &imp.inputs {
                // Every input of the bundled models carries the batch.
                let axis = i.batch_axis.expect("a batch axis");
                assert_eq!(i.dims[axis], batch, "{}", path.display());
            }
        }
    }
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/onnx")
        .join(name)
}

#[test]
fn popart_attributes_place_nodes_in_stages_and_ipus() {
    use prost::Message;
    use tessera_host::onnx::proto::AttributeProto;
    let mut m = OnnxModel::load(&fixture("cnn.onnx")).expect("loads");
    let nodes = m.proto.graph.as_mut().unwrap().node.len();
    let half = nodes / 2;
    for (i, n) in m.proto.graph.as_mut().unwrap().node.iter_mut().enumerate() {
        let stage = i64::from(i >= half);
        for (name, v) in [("__pipeline_stage", stage), ("__ipu_number", 1 - stage)] {
            n.attribute.push(AttributeProto {
                name: Some(name.into()),
                i: Some(v),
                r#type: Some(2),
                ..AttributeProto::default()
            });
        }
    }
    let bytes = m.proto.encode_to_vec();
    let m = OnnxModel::from_bytes(&bytes, &PathBuf::from("staged.onnx")).expect("decodes");
    let mut g: Graph<Heap> = Graph::new();
    let imp = import(&m, &mut g, &ImportOptions::default()).expect("imports");
    assert_eq!(imp.stages, 2);
    assert_eq!(imp.device_mapping, Some(vec![1, 0]));
    for l in &imp.layers {
        let want = usize::from(imp.layers.iter().position(|x| x == l).unwrap() >= half);
        assert_eq!(l.stage, want, "{}", l.name);
        for k in l.first..l.end {
            assert_eq!(g.nodes()[k].stage(), want, "{}", g.nodes()[k].name());
        }
    }
}

#[test]
fn named_boundaries_make_pipeline_stages_with_the_schedules_stash_depths() {
    use tessera_core::schedule::{Pipeline, Schedule};
    use tessera_host::compile::onnx::{compile_onnx, OnnxOptions};
    use tessera_host::compile::SessionOptions;
    let m = OnnxModel::load(&fixture("cnn.onnx")).expect("loads");
    let names = m.node_names();
    // After the first MaxPool, as ResNet-50 is split after conv4_block2's add.
    let cut = names
        .iter()
        .position(|n| n.contains("pool"))
        .expect("a pooling node");
    for schedule in [
        Schedule::Grouped,
        Schedule::Interleaved,
        Schedule::Sequential,
    ] {
        let so = SessionOptions {
            batch_size: 2,
            gradient_accumulation_count: 4,
            schedule,
            ..SessionOptions::default()
        };
        let oo = OnnxOptions {
            stages: Stages::After(vec![names[cut].clone()]),
            ..OnnxOptions::default()
        };
        let c = compile_onnx(&m, &so, &oo).expect("compiles");
        let e = c.target.estimate().expect("estimates");
        assert_eq!(e.stages.len(), 2);
        assert_eq!(e.ipus.len(), 2);
        let p = Pipeline::new(2, 4, schedule, true).unwrap();
        for s in &e.stages {
            // PopART's stash (ONNX models are PopART's): one entry more than the schedule's
            // depth for a Grouped stage whose backward is in a later pipeline stage.
            let popart = usize::from(schedule == Schedule::Grouped && s.stage == 0);
            assert_eq!(
                s.stash_depth,
                p.stash_depth(s.stage) + popart,
                "{schedule:?} stage {}",
                s.stage
            );
        }
        assert_eq!(c.imported.layers[cut].stage, 0);
        assert_eq!(c.imported.layers[cut + 1].stage, 1);
    }
}

/// A masked-LM head tied to an embedding in an earlier stage is a stage of its own on the
/// embedding's IPU, reading the embedding's table (no copy of it), its partial gradient
/// accumulated in its own stage; the pipeline then takes PopART's accumulation counts.
#[test]
fn a_tied_masked_lm_head_runs_on_its_embeddings_ipu() {
    use tessera_core::Roles;
    use tessera_host::compile::onnx::{compile_onnx, OnnxOptions};
    use tessera_host::compile::{SessionError, SessionOptions};
    let m = OnnxModel::load(&fixture("transformer.onnx")).expect("loads");
    let cut = "encoder/layer.0/output/LayerNorm/LayerNormalization".to_string();
    let so = |m: usize| SessionOptions {
        batch_size: 4,
        gradient_accumulation_count: m,
        ..SessionOptions::default()
    };
    let piped = OnnxOptions {
        stages: Stages::After(vec![cut]),
        ..OnnxOptions::default()
    };
    let params = |c: &tessera_host::compile::onnx::OnnxCompiled| -> usize {
        let g = c.target.plan.graph();
        g.nodes()
            .iter()
            .filter(|n| n.roles().contains(Roles::TRAINABLE))
            .map(|n| n.shape().elements())
            .sum()
    };
    // 7 is no multiple of TensorFlow's 2 x 3 stages, but fills PopART's 2 x 3 - 1.
    let c = compile_onnx(&m, &so(7), &piped).expect("compiles");
    let one = compile_onnx(&m, &so(7), &OnnxOptions::default()).expect("compiles");
    assert_eq!(
        params(&c),
        params(&one),
        "the decoder is the embedding's table"
    );
    let head = c.head.as_ref().expect("a masked-LM head");
    assert_eq!(head.tied_to, Some(0));
    assert_eq!(
        c.target.system.device_mapping.as_deref(),
        Some(&[0, 1, 0][..])
    );
    let g = c.target.plan.graph();
    let table = g.node(head.table).name().to_string();
    let accumulates: Vec<usize> = g
        .nodes()
        .iter()
        .filter(|n| n.name().starts_with(&format!("{table}/accumulate")))
        .map(|n| n.stage())
        .collect();
    assert_eq!(accumulates, vec![2, 0], "one partial per reading stage");
    // Training returns the loss alone: the model's output is not kept for the host.
    let out = c.imported.outputs[0].node;
    assert!(!g.node(out).roles().contains(Roles::OUTPUT));
    let e = c.target.estimate().expect("estimates");
    assert_eq!(e.stages.len(), 3);
    assert_eq!(e.stages[2].ipu, 0);
    assert_eq!(e.ipus.len(), 2);
    // Fewer micro-batches than the pipeline's 2 x 3 - 1 stages: refused, saying so.
    let c = compile_onnx(&m, &so(4), &piped).expect("compiles");
    match c.target.estimate() {
        Err(SessionError::System(e)) => {
            assert!(e.to_string().contains("at least 5"), "{e}")
        }
        other => panic!("expected a schedule error, got {:?}", other.map(|e| e.fits)),
    }
}

/// The `onnx` package's weight-free zoo models (opset 9, as shipped; data/onnx/zoo_light/)
/// estimate for inference and training at batch 1 and 8: every op of theirs is read (LRN,
/// Dropout's mask, ConstantOfShape weights of up to 102.8 M elements).
#[test]
fn the_light_zoo_models_estimate_as_shipped() {
    use tessera_host::compile::onnx::{compile_onnx, OnnxOptions};
    use tessera_host::compile::SessionOptions;
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data/onnx/zoo_light");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("data/onnx/zoo_light")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "onnx"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 9, "{files:?}");
    for f in &files {
        let m = OnnxModel::load(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        assert_eq!(m.opset, 9);
        for inference in [true, false] {
            for batch in [1, 8] {
                let so = SessionOptions {
                    batch_size: batch,
                    ..SessionOptions::default()
                };
                let oo = OnnxOptions {
                    inference,
                    ..OnnxOptions::default()
                };
                let what = format!("{} batch {batch} inference {inference}", f.display());
                let c = compile_onnx(&m, &so, &oo).unwrap_or_else(|e| panic!("{what}: {e}"));
                let e = c
                    .target
                    .estimate()
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(c.imported.batch, batch, "{what}");
                assert!(e.samples_per_second > 0.0, "{what}");
                // ZFNet-512 fits for inference at batch 1 (its LRN, a pool over rows of
                // H x W elements, once received whole rows onto a tile).
                if inference && batch == 1 && what.contains("zfnet") {
                    assert!(e.fits, "{what}: does not fit");
                }
            }
        }
    }
}

/// An estimate imports its model once: the stages asked for, an automatic split's attempts
/// and the search for the fewest IPUs are all placed in copies of that import. Rebinding a
/// batch the file fixes adds one shape pass at the file's batch (the shapes written into the
/// file that rebinding rescales). Counted on this thread, where the estimate runs.
#[test]
fn an_estimate_imports_its_model_once() {
    use tessera_host::estimation::{estimate_with, EstimateOptions, ModelSource, Progress};
    use tessera_host::onnx::import_count;
    let bert = ModelSource::OnnxFile(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data/onnx/bert_base.stripped.onnx"),
    );
    let cases = [
        // The file's batch (1) on one IPU: it does not fit, and the search for the fewest
        // IPUs tries automatic splits.
        (
            "the file's batch with the search",
            EstimateOptions::default(),
            0,
        ),
        (
            "batch 8 split over 4 IPUs",
            EstimateOptions {
                batch_size: Some(8),
                pipeline_ipus: Some(4),
                ..EstimateOptions::default()
            },
            1,
        ),
    ];
    for (what, options, shape_passes) in cases {
        let before = import_count();
        let mut searched = false;
        let e = estimate_with(&bert, &options, &mut |p| {
            searched |= matches!(p, Progress::Searching { .. })
        })
        .unwrap_or_else(|e| panic!("{what}: {e}"));
        let after = import_count();
        assert_eq!(after.imports - before.imports, 1, "{what}: imports");
        assert_eq!(
            after.shape_passes - before.shape_passes,
            shape_passes,
            "{what}: shape passes"
        );
        let facts = e.onnx.as_ref().expect("ONNX facts");
        if options.pipeline_ipus.is_none() {
            assert!(
                searched && facts.fewest_ipus.is_some(),
                "{what}: the search ran"
            );
        } else {
            assert_eq!(facts.split.as_ref().map(|s| s.ipus), Some(4), "{what}");
        }
    }
}

mod staging {
    use std::collections::HashMap;

    use proptest::prelude::*;
    use tessera_core::Plan;
    use tessera_host::onnx::{ImportOptions, OnnxGraph, OnnxModel, Stages};

    /// Models whose weights are read by several nodes (products sharing a weight, a layer
    /// norm's scale read twice), so that stage boundaries between their readers copy them.
    fn shared() -> Vec<OnnxModel> {
        [
            "../tests/fixtures/onnx/einsum.onnx",
            "../data/onnx/bert_tiny.stripped.onnx",
        ]
        .iter()
        .map(|p| {
            OnnxModel::load(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(p))
                .expect("loads")
        })
        .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        /// Any placement of a model's nodes in stages (each node in its ONNX node's stage,
        /// stages in graph order) keeps the import's nodes and adds, for each weight, one
        /// variable per other stage that reads it; no node reads a variable of another
        /// stage; and the graph plans.
        #[test]
        fn stages_copy_shared_weights_into_each_stage_that_reads_them(
            which in 0usize..2,
            cuts in proptest::collection::vec(0.0f64..1.0, 0..4),
        ) {
            let models = shared();
            let m = &models[which];
            let og = OnnxGraph::import(m, &ImportOptions::default()).expect("imports");
            let n = m.graph().node.len();
            let mut at: Vec<usize> = cuts.iter().map(|c| (c * n as f64) as usize).collect();
            at.sort_unstable();
            let per_node: Vec<usize> =
                (0..n).map(|i| at.iter().filter(|&&c| c < i).count()).collect();
            let (g, imp) = og.staged(&Stages::PerNode(per_node.clone())).expect("stages");
            let one = og.imported();
            for (l, layer) in imp.layers.iter().enumerate() {
                prop_assert_eq!(layer.stage, per_node[l]);
                for k in layer.first..layer.end {
                    prop_assert_eq!(g.nodes()[k].stage(), per_node[l], "node {}", k);
                }
            }
            // Which stages read each variable (by its weight's name).
            let base = |name: &str| name.split("@stage").next().unwrap_or(name).to_string();
            let mut readers: HashMap<String, Vec<usize>> = HashMap::new();
            for n in g.nodes() {
                for &o in n.op().operands().as_slice() {
                    let v = g.node(o);
                    if v.op().is_state() && v.roles().contains(tessera_core::Roles::TRAINABLE) {
                        prop_assert_eq!(v.stage(), n.stage(), "`{}` reads `{}`", n.name(), v.name());
                        let r = readers.entry(base(v.name())).or_default();
                        if !r.contains(&n.stage()) {
                            r.push(n.stage());
                        }
                    }
                }
            }
            let copies: usize = readers.values().map(|r| r.len() - 1).sum();
            let held = g.nodes().iter().filter(|n| n.name().contains("@stage")).count();
            prop_assert_eq!(held, copies);
            prop_assert_eq!(g.len(), one_stage_len(&og) + copies);
            prop_assert_eq!(imp.state.len(), one.state.len() + copies);
            prop_assert!(Plan::new(&g).is_ok());
            prop_assert_eq!(imp.stages, per_node.last().map_or(1, |s| s + 1));
        }
    }

    fn one_stage_len(og: &OnnxGraph<'_>) -> usize {
        og.staged(&Stages::One).expect("one stage").0.len()
    }

    /// A boundary between two readers of a weight copies it (the property above sees
    /// copies, not only placements without them).
    #[test]
    fn a_boundary_between_readers_copies_their_weight() {
        let models = shared();
        let og = OnnxGraph::import(&models[0], &ImportOptions::default()).expect("imports");
        let n = models[0].graph().node.len();
        let (g, _) = og
            .staged(&Stages::PerNode((0..n).collect()))
            .expect("stages");
        let held = g
            .nodes()
            .iter()
            .filter(|n| n.name().contains("@stage"))
            .count();
        assert!(held > 0, "no weight was copied");
    }
}

/// Weights written as `Constant` nodes (PaddlePaddle's exporter writes them so) are weights
/// in training as initializers are (PopART's rule): cnn.onnx with every float initializer of
/// several elements moved into a `Constant` node trains the same parameters.
#[test]
fn weights_in_constant_nodes_train_as_initializers_do() {
    use prost::Message as _;
    use tessera_host::onnx::proto::{attribute_proto::AttributeType, AttributeProto, NodeProto};
    let trainable = |m: &OnnxModel| {
        let mut g: Graph<Heap> = Graph::new();
        let opts = ImportOptions {
            training: true,
            ..ImportOptions::default()
        };
        import(m, &mut g, &opts).expect("imports");
        g.nodes()
            .iter()
            .filter(|n| n.roles().contains(tessera_core::Roles::TRAINABLE))
            .map(|n| n.shape().elements())
            .sum::<usize>()
    };
    let path = fixture("cnn.onnx");
    let original = OnnxModel::load(&path).unwrap();
    let mut proto = original.proto.clone();
    let graph = proto.graph.as_mut().unwrap();
    let (weights, rest): (Vec<_>, Vec<_>) = graph
        .initializer
        .drain(..)
        .partition(|t| t.data_type == Some(1) && t.dims.iter().product::<i64>() > 1);
    assert!(weights.len() >= 4, "{}", weights.len());
    graph.initializer = rest;
    let mut nodes: Vec<NodeProto> = weights
        .into_iter()
        .map(|t| NodeProto {
            output: vec![t.name.clone().unwrap_or_default()],
            op_type: Some("Constant".into()),
            attribute: vec![AttributeProto {
                name: Some("value".into()),
                r#type: Some(AttributeType::Tensor as i32),
                t: Some(t),
                ..Default::default()
            }],
            ..Default::default()
        })
        .collect();
    nodes.append(&mut graph.node);
    graph.node = nodes;
    let constants = OnnxModel::from_bytes(&proto.encode_to_vec(), &path).unwrap();
    let want = trainable(&original);
    assert!(want > 500, "{want}");
    assert_eq!(trainable(&constants), want);
}
