//! The README's `tessera estimate` examples run as written, from the repository's root, and
//! do what the comment beside each says: exit status 0, or 1 with the tile named where the
//! comment says the model does not fit; the other claims a comment makes that the output can
//! show (IPUs, replicas, the steady state) are checked too. Lines with placeholders
//! (`MODEL`, `FILE.npy`), training and sweeps (checked by their own tests) are left out.

use std::path::Path;
use std::process::Command;

/// One README command: its arguments after `tessera`, and the comment beside it.
struct Example {
    args: Vec<String>,
    comment: String,
}

/// The `tessera estimate` lines of the README's `sh` blocks, continuation lines joined, without
/// placeholders.
fn examples(readme: &str) -> Vec<Example> {
    let mut out = Vec::new();
    let mut in_sh = false;
    let mut pending = String::new();
    for line in readme.lines() {
        if line.starts_with("```") {
            in_sh = line.trim() == "```sh";
            continue;
        }
        if !in_sh {
            continue;
        }
        pending.push_str(line);
        // A line ending in a backslash, before any comment, continues.
        let (code, _) = pending.split_once('#').unwrap_or((&pending, ""));
        if code.trim_end().ends_with('\\') {
            pending = pending.replacen('\\', " ", 1);
            continue;
        }
        let whole = std::mem::take(&mut pending);
        let (code, comment) = whole.split_once(" #").unwrap_or((&whole, ""));
        let words: Vec<String> = code.split_whitespace().map(str::to_string).collect();
        let placeholder = words
            .iter()
            .any(|w| w.contains(|c: char| c.is_ascii_uppercase()) || w.starts_with('['));
        if words.len() > 1 && words[0] == "tessera" && words[1] == "estimate" && !placeholder {
            out.push(Example {
                args: words[1..].to_vec(),
                comment: comment.trim().to_string(),
            });
        }
    }
    out
}

#[test]
fn every_readme_estimate_runs_as_its_comment_says() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let examples = examples(&readme);
    assert!(examples.len() >= 10, "{} examples found", examples.len());
    for ex in &examples {
        let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(&ex.args)
            .current_dir(&root)
            .output()
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        let shown = format!(
            "tessera {} # {}\n{stdout}{stderr}",
            ex.args.join(" "),
            ex.comment
        );
        if ex.comment.contains("does not fit") {
            assert_eq!(out.status.code(), Some(1), "{shown}");
            assert!(
                stderr.contains("does not fit") && stderr.contains("tile"),
                "{shown}"
            );
        } else {
            assert_eq!(out.status.code(), Some(0), "{shown}");
            assert!(stdout.contains("fits: yes"), "{shown}");
        }
        if ex.comment.contains("two IPUs") || ex.comment.contains("pipelined over two") {
            assert!(
                stdout.contains("IPU 1:") && !stdout.contains("IPU 2:"),
                "{shown}"
            );
        }
        if ex.comment.contains("one IPU") {
            assert!(
                stdout.contains("IPU 0:") && !stdout.contains("IPU 1:"),
                "{shown}"
            );
        }
        if ex.comment.contains("steady state") {
            assert!(stdout.contains("\nsteady state: "), "{shown}");
        }
        if ex.comment.contains("Bow Pod16: 4 replicas") {
            assert!(
                stdout.contains("4 x bow per replica, 4 replica(s)"),
                "{shown}"
            );
            assert!(stdout.contains("system: Bow Pod16 (16 IPUs)"), "{shown}");
        }
    }
}

#[test]
fn examples_are_read_with_their_comments_and_continuations() {
    let text = "```sh\ntessera estimate a.onnx --x 1 \\\n    --y 2   # two IPUs\ntessera estimate MODEL.onnx  # placeholder\ntessera train\n```\n```text\ntessera estimate b\n```\n";
    let ex = examples(text);
    assert_eq!(ex.len(), 1);
    assert_eq!(ex[0].args, ["estimate", "a.onnx", "--x", "1", "--y", "2"]);
    assert_eq!(ex[0].comment, "two IPUs");
}
