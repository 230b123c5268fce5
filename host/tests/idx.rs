//! Integration tests for the IDX reader: the bundled binarized MNIST subset, and property tests
//! that no input, however malformed, makes the parsers panic.

use std::io::Write;
use std::path::Path;

use proptest::prelude::*;
use tessera_host::idx::{self, IdxError, Images, Labels};

/// Builds an IDX buffer from a magic number, dimensions and data.
fn idx_bytes(magic: u32, dims: &[u32], data: &[u8]) -> Vec<u8> {
    let mut out = magic.to_be_bytes().to_vec();
    for d in dims {
        out.extend_from_slice(&d.to_be_bytes());
    }
    out.extend_from_slice(data);
    out
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

/// Checks the invariants every successfully parsed images value must hold.
fn check_images(images: &Images) {
    assert_eq!(
        images.pixels.len(),
        images.count * images.rows * images.cols
    );
    if images.count > 0 {
        assert_eq!(
            images.image(images.count - 1).len(),
            images.pixels_per_image()
        );
    }
}

/// Runs both parsers on `bytes`; they may fail but must not panic, and must not both succeed
/// (a valid images file is never a valid labels file, the magic numbers differ).
fn parse_both(bytes: &[u8]) -> (Result<Images, IdxError>, Result<Labels, IdxError>) {
    let images = idx::parse_images(bytes, "prop");
    let labels = idx::parse_labels(bytes, "prop");
    if let Ok(images) = &images {
        check_images(images);
    }
    assert!(images.is_err() || labels.is_err());
    for e in [images.as_ref().err(), labels.as_ref().err()]
        .into_iter()
        .flatten()
    {
        let message = e.to_string();
        assert!(message.starts_with("prop: "), "{message}");
        assert!(!message.contains('\n'), "{message}");
    }
    (images, labels)
}

/// A small valid images file with arbitrary dimensions and pixels.
fn valid_images() -> impl Strategy<Value = Vec<u8>> {
    (0u32..5, 0u32..6, 0u32..6).prop_flat_map(|(n, r, c)| {
        proptest::collection::vec(any::<u8>(), (n * r * c) as usize)
            .prop_map(move |px| idx_bytes(0x0803, &[n, r, c], &px))
    })
}

/// A small valid labels file.
fn valid_labels() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..40)
        .prop_map(|l| idx_bytes(0x0801, &[u32::try_from(l.len()).unwrap()], &l))
}

/// A valid images or labels file, raw or gzipped.
fn valid_file() -> impl Strategy<Value = Vec<u8>> {
    (prop_oneof![valid_images(), valid_labels()], any::<bool>()).prop_map(|(raw, gz)| {
        if gz {
            gzip(&raw)
        } else {
            raw
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = parse_both(&bytes);
    }

    #[test]
    fn arbitrary_bytes_after_a_valid_magic_never_panic(
        magic in prop_oneof![Just(0x0803u32), Just(0x0801u32)],
        dims in proptest::collection::vec(
            prop_oneof![0u32..8, any::<u32>()], 0..4),
        tail in proptest::collection::vec(any::<u8>(), 0..128),
        gz in any::<bool>(),
    ) {
        let raw = idx_bytes(magic, &dims, &tail);
        let bytes = if gz { gzip(&raw) } else { raw };
        let _ = parse_both(&bytes);
    }

    #[test]
    fn arbitrary_gzip_streams_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let mut stream = vec![0x1f, 0x8b];
        stream.extend_from_slice(&bytes);
        let _ = parse_both(&stream);
    }

    #[test]
    fn valid_files_parse(raw in prop_oneof![valid_images(), valid_labels()], gz in any::<bool>()) {
        let bytes = if gz { gzip(&raw) } else { raw.clone() };
        let (images, labels) = parse_both(&bytes);
        prop_assert!(images.is_ok() || labels.is_ok());
        if let Ok(images) = images {
            prop_assert_eq!(&images.pixels[..], &raw[16..]);
        }
        if let Ok(labels) = labels {
            prop_assert_eq!(&labels.labels[..], &raw[8..]);
        }
    }

    #[test]
    fn truncations_never_panic(bytes in valid_file(), cut in any::<prop::sample::Index>()) {
        let cut = cut.index(bytes.len());
        let (images, labels) = parse_both(&bytes[..cut]);
        // A raw file cut short is always an error; gzip may fail either way.
        if bytes[0] != 0x1f {
            prop_assert!(images.is_err() && labels.is_err());
        }
    }

    #[test]
    fn bit_flips_never_panic(
        bytes in valid_file(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), 0u8..8), 1..4),
    ) {
        let mut bytes = bytes;
        for (at, bit) in flips {
            let at = at.index(bytes.len());
            bytes[at] ^= 1 << bit;
        }
        let _ = parse_both(&bytes);
    }

    #[test]
    fn appended_bytes_never_panic(
        bytes in valid_file(),
        extra in proptest::collection::vec(any::<u8>(), 1..16),
    ) {
        let gz = bytes[0] == 0x1f;
        let mut bytes = bytes;
        bytes.extend_from_slice(&extra);
        let (images, labels) = parse_both(&bytes);
        // Extra bytes after a raw file are always rejected.
        if !gz {
            prop_assert!(images.is_err() && labels.is_err());
        }
    }
}

#[test]
fn bundled_binarized_mnist() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/mnist-binarized-10k");
    let mnist = idx::load_mnist(&dir).unwrap_or_else(|e| panic!("{e}"));

    for (images, labels, count) in [
        (&mnist.train_images, &mnist.train_labels, 8000),
        (&mnist.test_images, &mnist.test_labels, 2000),
    ] {
        assert_eq!(images.count, count);
        assert_eq!((images.rows, images.cols), (28, 28));
        assert_eq!(images.pixels_per_image(), 784);
        assert_eq!(images.pixels.len(), count * 784);
        assert_eq!(labels.labels.len(), count);

        let mut seen = [false; 10];
        for &label in &labels.labels {
            assert!(label < 10, "label {label} out of range");
            seen[usize::from(label)] = true;
        }
        assert!(seen.iter().all(|&s| s), "missing classes: {seen:?}");

        assert!(
            images.pixels.iter().all(|&p| p == 0 || p == 255),
            "pixels must be binarized to 0 or 255"
        );
        // Not degenerate: every image has some ink and some background.
        for i in 0..images.count {
            let image = images.image(i);
            assert!(image.contains(&255) && image.contains(&0), "image {i}");
        }
    }
}
