//! The firmware example under QEMU predicts what the host predicts for the same digits, with
//! logits within 1e-5; and the core cross-compiles for Cortex-M and RISC-V with only `core`
//! (so no dependency can pull in std or alloc).
//!
//! These need the cross toolchain and QEMU (`scripts/install-cross-tools`). Without them the
//! tests say so and pass, unless `TESSERA_REQUIRE_CROSS=1` (as `.ci/run` sets), when a missing
//! tool is a failure.

use std::path::{Path, PathBuf};
use std::process::Command;

use tessera::core::models::mnist_cnn;
use tessera::core::{DType, Fixed, Graph, Plan};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Whether the cross tools exist; panics if they are required and missing.
fn tools_present(test: &str) -> bool {
    let have = Path::new("/usr/bin/rustc").exists()
        && Path::new("/usr/bin/cargo").exists()
        && Command::new("qemu-system-arm")
            .arg("--version")
            .output()
            .is_ok();
    if !have {
        let required = std::env::var("TESSERA_REQUIRE_CROSS").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "{test}: cross tools missing; run scripts/install-cross-tools"
        );
        eprintln!(
            "{test}: skipped, cross tools missing (scripts/install-cross-tools installs them)"
        );
    }
    have
}

/// One line of the firmware's output: `digit i: label L prediction P logits [..]`.
fn parse_line(line: &str) -> Option<(usize, usize, usize, Vec<f32>)> {
    let rest = line.strip_prefix("digit ")?;
    let (i, rest) = rest.split_once(": label ")?;
    let (label, rest) = rest.split_once(" prediction ")?;
    let (pred, rest) = rest.split_once(" logits [")?;
    let logits = rest
        .strip_suffix(']')?
        .split(", ")
        .map(|v| v.parse().ok())
        .collect::<Option<Vec<f32>>>()?;
    Some((
        i.parse().ok()?,
        label.parse().ok()?,
        pred.parse().ok()?,
        logits,
    ))
}

#[test]
fn firmware_under_qemu_matches_the_host() {
    if !tools_present("firmware_under_qemu_matches_the_host") {
        return;
    }
    let out = Command::new(root().join("scripts/run-firmware"))
        .output()
        .expect("run scripts/run-firmware");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "firmware failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let fw: Vec<_> = stdout.lines().filter_map(parse_line).collect();

    let data = root().join("examples/firmware/data");
    let weights = std::fs::read(data.join("weights.bin")).unwrap();
    let digits = std::fs::read(data.join("digits.bin")).unwrap();
    let labels = std::fs::read(data.join("labels.bin")).unwrap();
    assert_eq!(
        fw.len(),
        labels.len(),
        "one line per bundled digit:\n{stdout}"
    );

    let mut g: Graph<Fixed<24>> = Graph::new();
    let m = mnist_cnn(&mut g, 1, DType::F32).unwrap();
    // The host's plan unfolds convolutions in workspaces, the firmware's runs them as direct
    // loops: the same sums either way.
    let plan = Plan::new(&g).unwrap();
    assert_eq!(weights.len(), plan.state_bytes());
    let mut arena = vec![0u8; plan.arena_bytes()];
    for (i, digit) in digits.chunks_exact(784).enumerate() {
        plan.fill_input(m.images, &mut arena, 784, |p| f32::from(digit[p]) / 255.0)
            .unwrap();
        plan.infer(&mut arena, &weights).unwrap();
        let host: Vec<f32> = plan
            .tensor(m.logits, &arena, &weights)
            .unwrap()
            .iter()
            .collect();
        let pred = (0..10).fold(0, |b, c| if host[c] > host[b] { c } else { b });
        let (fi, flabel, fpred, flogits) = &fw[i];
        assert_eq!((*fi, *flabel), (i, usize::from(labels[i])));
        assert_eq!(
            *fpred, pred,
            "digit {i}: firmware predicts {fpred}, host {pred}"
        );
        for (a, b) in flogits.iter().zip(&host) {
            assert!(
                (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                "digit {i}: logit {a} vs host {b}"
            );
        }
    }
    let sizes = String::from_utf8_lossy(&out.stderr);
    if let Some(line) = sizes.lines().find(|l| l.starts_with("firmware: flash")) {
        eprintln!("{line}");
    }
}

#[test]
fn core_cross_compiles_without_std() {
    if !tools_present("core_cross_compiles_without_std") {
        return;
    }
    let out = Command::new(root().join("scripts/cross-build"))
        .output()
        .expect("run scripts/cross-build");
    assert!(
        out.status.success(),
        "cross build failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn core_declares_no_std_and_never_names_alloc() {
    let lib = std::fs::read_to_string(root().join("core/src/lib.rs")).unwrap();
    assert!(lib.contains("#![no_std]"));
    let mut dirs = vec![root().join("core/src")];
    let mut files = 0;
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(
                !text.contains("extern crate alloc") && !text.contains("extern crate std"),
                "{}",
                path.display()
            );
            files += 1;
        }
    }
    assert!(files > 10, "only {files} source files found");
}
