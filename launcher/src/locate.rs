//! Where each key of a YAML document is, so that an error found after parsing (a rule across
//! fields, or one run of the matrix that the worker would refuse) still names a line and column.
//!
//! serde_yaml reports positions only for the errors it raises itself; this index is built from
//! the same text with an event parser (saphyr) and maps key paths (`cluster.gpus_per_node`,
//! `sweep[1].offload`, `sweep.stages[2]`) to the position of the key, or of the element for
//! sequence items.

use std::collections::HashMap;

use saphyr_parser::{Event, Parser};

/// A 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pos {
    pub line: usize,
    pub column: usize,
}

/// Key paths to positions. Built once per spec; lookups fall back to the nearest ancestor that
/// the document spells out (a default value has no position of its own).
#[derive(Debug, Default)]
pub struct KeyIndex {
    positions: HashMap<String, Pos>,
    /// The first key written twice in one mapping: its path, where it was first, where again.
    /// serde keeps the last of a flattened map's (`worker:`, `cluster.env`) without a word.
    duplicate: Option<(String, Pos, Pos)>,
}

enum Frame {
    /// In a mapping: the path of the mapping, the key whose value comes next (if any), and the
    /// keys it has had, with their positions.
    Map { path: String, key: Option<String>, seen: HashMap<String, Pos> },
    /// In a sequence: the path of the sequence and the next index.
    Seq { path: String, next: usize },
}

impl KeyIndex {
    /// Indexes a document. Text that does not parse gives an empty index: the typed parse reports
    /// the syntax error with its own position.
    pub fn build(text: &str) -> Self {
        let mut idx = KeyIndex::default();
        let mut stack: Vec<Frame> = Vec::new();
        let mut parser = Parser::new_from_str(text);
        while let Some(Ok((event, span))) = parser.next_event() {
            let pos = Pos { line: span.start.line(), column: span.start.col() + 1 };
            // The path of the node this event starts (for scalars and collection starts).
            let node_path = |stack: &mut Vec<Frame>, idx: &mut KeyIndex| -> Option<String> {
                match stack.last_mut() {
                    None => Some(String::new()),
                    Some(Frame::Map { key: Some(_), .. }) => {
                        let Some(Frame::Map { path, key, .. }) = stack.last_mut() else { return None };
                        let k = key.take()?;
                        Some(join(path, &k))
                    }
                    Some(Frame::Map { key: None, .. }) => None,
                    Some(Frame::Seq { path, next }) => {
                        let p = format!("{path}[{next}]");
                        *next += 1;
                        idx.positions.entry(p.clone()).or_insert(pos);
                        Some(p)
                    }
                }
            };
            match event {
                Event::Scalar(value, ..) => {
                    if let Some(Frame::Map { path, key: key @ None, seen }) = stack.last_mut() {
                        // A key: remember where it is; its value comes next.
                        let p = join(path, &value);
                        if let Some(first) = seen.insert(value.to_string(), pos) {
                            idx.duplicate.get_or_insert((p.clone(), first, pos));
                        }
                        idx.positions.entry(p).or_insert(pos);
                        *key = Some(value.into_owned());
                    } else {
                        node_path(&mut stack, &mut idx);
                    }
                }
                Event::MappingStart(..) => {
                    let path = node_path(&mut stack, &mut idx).unwrap_or_default();
                    stack.push(Frame::Map { path, key: None, seen: HashMap::new() });
                }
                Event::SequenceStart(..) => {
                    let path = node_path(&mut stack, &mut idx).unwrap_or_default();
                    stack.push(Frame::Seq { path, next: 0 });
                }
                Event::Alias(_) => {
                    node_path(&mut stack, &mut idx);
                }
                Event::MappingEnd | Event::SequenceEnd => {
                    stack.pop();
                }
                _ => {}
            }
        }
        idx
    }

    /// The first key written twice in one mapping: its path, where it was first, and where again.
    pub fn duplicate(&self) -> Option<(&str, Pos, Pos)> {
        self.duplicate.as_ref().map(|(p, a, b)| (p.as_str(), *a, *b))
    }

    /// Whether the document spells out exactly `path`.
    pub fn contains(&self, path: &str) -> bool {
        self.positions.contains_key(path)
    }

    /// The key path at exactly `pos` (the deepest, when a sequence item and its first key share
    /// a position).
    pub fn key_at(&self, pos: Pos) -> Option<&str> {
        self.positions.iter().filter(|(_, p)| **p == pos).map(|(k, _)| k.as_str()).max_by_key(|k| k.len())
    }

    /// The position of `path`, or of its nearest ancestor present in the document.
    pub fn find(&self, path: &str) -> Option<Pos> {
        let mut p = path;
        loop {
            if let Some(pos) = self.positions.get(p) {
                return Some(*pos);
            }
            let cut = p.rfind(['.', '['])?;
            p = &p[..cut];
        }
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_keys_and_items() {
        let text = "cluster:\n  partition: gpu\n  env: {A: 1, B: 2}\nsweep:\n  - models: [gpt2]\n    stages:\n      - 0\n      - 3\n  - models: [tiny]\n";
        let idx = KeyIndex::build(text);
        assert_eq!(idx.find("cluster"), Some(Pos { line: 1, column: 1 }));
        assert_eq!(idx.find("cluster.partition"), Some(Pos { line: 2, column: 3 }));
        assert_eq!(idx.find("cluster.env.B"), Some(Pos { line: 3, column: 15 }));
        assert_eq!(idx.find("sweep[0].stages"), Some(Pos { line: 6, column: 5 }));
        assert_eq!(idx.find("sweep[0].stages[1]"), Some(Pos { line: 8, column: 9 }));
        assert_eq!(idx.find("sweep[1].models"), Some(Pos { line: 9, column: 5 }));
        // Absent keys fall back to their parent.
        assert_eq!(idx.find("sweep[1].offload"), Some(Pos { line: 9, column: 5 }));
        assert_eq!(idx.find("worker.steps"), None);
        assert!(idx.contains("sweep[1]") && !idx.contains("sweep[2]"));
        assert_eq!(idx.key_at(Pos { line: 2, column: 3 }), Some("cluster.partition"));
        assert_eq!(idx.key_at(Pos { line: 9, column: 5 }), Some("sweep[1].models"));
    }

    #[test]
    fn an_alias_is_a_value_and_an_item() {
        // An alias stands where a value or an item would: the key after it is still a key, and
        // the item after it is the next item.
        let idx = KeyIndex::build("base: &b 1\nx: *b\ny: 2\nlist: [*b, 3]\n");
        assert_eq!(idx.find("y"), Some(Pos { line: 3, column: 1 }));
        assert_eq!(idx.find("list[1]"), Some(Pos { line: 4, column: 12 }));
        assert!(idx.contains("list[0]") && !idx.contains("list[2]"));
    }

    /// A key written twice in one mapping is found, at its second place; the same key in two
    /// mappings, and a merge key's keys, are not duplicates.
    #[test]
    fn a_key_written_twice_in_one_mapping() {
        let idx = KeyIndex::build("worker:\n  steps: 3\n  seed: 1\n  steps: 500\n");
        assert_eq!(idx.duplicate(), Some(("worker.steps", Pos { line: 2, column: 3 }, Pos { line: 4, column: 3 })));
        let idx = KeyIndex::build("cluster: {env: {A: x, A: y}}\n");
        assert_eq!(idx.duplicate().map(|d| d.0), Some("cluster.env.A"));
        assert_eq!(KeyIndex::build("a: {x: 1}\nb: {x: 2}\nlist: [{x: 1}, {x: 2}]\n").duplicate(), None);
        assert_eq!(KeyIndex::build("base: &b {x: 1}\nc:\n  <<: *b\n  x: 2\n").duplicate(), None);
    }

    #[test]
    fn broken_text_gives_an_empty_index() {
        assert_eq!(KeyIndex::build("a: [1, 2\n").find("a"), Some(Pos { line: 1, column: 1 }));
        assert_eq!(KeyIndex::build(": : :").find("x"), None);
    }
}
