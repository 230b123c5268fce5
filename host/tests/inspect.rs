//! Properties of tensor inspection and model files: the collector receives every element in
//! order however the host's dequeues interleave with the device's enqueues; MaybeOutfeed keeps
//! exactly the keys some filter is a substring of; model files never panic the parser, and
//! a model written as a file reads back as the same model.

use std::collections::BTreeMap;

use proptest::prelude::*;
use tessera_host::inspect::{Collector, MaybeOutfeedQueue};
use tessera_host::model::{Layer, LayerActivation, Model, Sequential};
use tessera_host::outfeed::{HostTensor, OutfeedMode, OutfeedQueue};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn collector_keeps_every_element_in_order(
        drains in prop::collection::vec(any::<bool>(), 1..60),
        width in 1usize..5,
    ) {
        let q = OutfeedQueue::new("q", OutfeedMode::All, 255, 1).unwrap();
        let mut c = Collector::new();
        for (i, drain) in drains.iter().enumerate() {
            let t = HostTensor::new(vec![width], vec![i as f32; width]).unwrap();
            q.enqueue(vec![BTreeMap::from([("k".to_string(), t)]).into()]).unwrap();
            if *drain {
                c.push(q.dequeue().unwrap()).unwrap();
            }
        }
        c.push(q.dequeue().unwrap()).unwrap();
        let m = c.take();
        let k = &m["k"];
        prop_assert_eq!(&k.shape, &vec![drains.len(), width]);
        for (i, row) in k.data.chunks(width).enumerate() {
            prop_assert!(row.iter().all(|&v| v == i as f32));
        }
    }

    #[test]
    fn maybe_outfeed_keeps_exactly_the_matching_keys(
        keys in prop::collection::btree_set("[a-c_/]{1,6}", 0..8),
        filters in prop::option::of(prop::collection::vec("[a-c]{1,2}", 0..3)),
    ) {
        let q = MaybeOutfeedQueue::new(OutfeedQueue::with_defaults("m"), filters.clone());
        let mut map = BTreeMap::new();
        for k in &keys {
            q.maybe_outfeed(&mut map, k, || HostTensor::scalar(1.0));
        }
        for k in &keys {
            let expected = filters
                .as_ref()
                .is_none_or(|f| f.iter().any(|s| k.contains(s.as_str())));
            prop_assert_eq!(map.contains_key(k), expected, "key {}", k);
        }
        let empty = map.is_empty();
        let report = q.maybe_enqueue(vec![map]).unwrap();
        prop_assert_eq!(report.is_none(), empty);
        prop_assert_eq!(q.queue().enqueued(), u64::from(!empty));
    }

    #[test]
    fn model_files_never_panic(text in "[\\[\\]a-z_=\"0-9 ,{}\\n.]{0,200}") {
        let _ = Model::from_toml(&text, "fuzz.toml");
    }

    #[test]
    fn sequential_models_read_back_from_files(
        widths in prop::collection::vec(1usize..64, 1..5),
        split in 0usize..5,
    ) {
        let n = widths.len();
        let mut s = Sequential::new("m", "images", &[4, 4]);
        s.add(Layer::flatten("Flatten"));
        let mut file = String::from("name = \"m\"\ninput = { name = \"images\", shape = [4, 4] }\n\n[[layer]]\ntype = \"flatten\"\nname = \"Flatten\"\n");
        for (i, w) in widths.iter().enumerate() {
            s.add(Layer::dense(&format!("D{i}"), *w, LayerActivation::Relu));
            file.push_str(&format!(
                "\n[[layer]]\ntype = \"dense\"\nname = \"D{i}\"\nunits = {w}\nactivation = \"relu\"\n"
            ));
        }
        let stages: Vec<usize> = (0..=n).map(|i| usize::from(i > split.min(n - 1))).collect();
        let last_stage = *stages.last().unwrap();
        // Every stage must hold a layer: stage 1 exists only when some layer is after `split`.
        s.set_pipeline_stage_assignment(&stages);
        file.push_str(&format!("\n[pipeline]\nstage_assignment = {stages:?}\n"));
        let built = s.build().unwrap();
        let read = Model::from_toml(&file, "m.toml").unwrap();
        prop_assert_eq!(&built.layers, &read.layers);
        prop_assert_eq!(read.stage_count(), last_stage + 1);
    }
}
