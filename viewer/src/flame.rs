//! Live memory by stack as an icicle graph (the heaptrack / memray view): the live allocations
//! of one moment, grouped by call stack, merged into a tree of frames (outermost at the top),
//! and laid out as cells whose widths are their bytes' share of the moment's total.

use std::collections::HashMap;

/// Label of the cell for allocations without a stack.
pub const NO_STACK: &str = "<no stack>";

/// A frame of the tree and the live bytes under it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlameNode {
    pub label: String,
    pub bytes: u64,
    /// Indexes into `Flame::nodes`, largest first once built.
    pub children: Vec<usize>,
}

/// The tree of frames of a moment's live allocations; `nodes[0]` is the root (every stack).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flame {
    pub nodes: Vec<FlameNode>,
}

/// One cell of the icicle: a frame at a depth (0 = the outermost frames), its share of the
/// total as a start and a width (fractions of the root), and its bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct Cell {
    pub depth: u32,
    pub start: f64,
    pub width: f64,
    pub label: String,
    pub bytes: u64,
}

impl Flame {
    /// Merges stacks (frames innermost first, as the model gives them, with their live bytes)
    /// into one tree, outermost frame first.
    pub fn from_stacks<'a>(stacks: impl IntoIterator<Item = (&'a [String], u64)>) -> Self {
        let mut nodes = vec![FlameNode {
            label: "all".into(),
            bytes: 0,
            children: Vec::new(),
        }];
        let mut index: HashMap<(usize, String), usize> = HashMap::new();
        for (frames, bytes) in stacks {
            nodes[0].bytes = nodes[0].bytes.saturating_add(bytes);
            let no_stack = [NO_STACK.to_string()];
            let path: &[String] = if frames.is_empty() { &no_stack } else { frames };
            let mut at = 0;
            for label in path.iter().rev() {
                let next = *index.entry((at, label.clone())).or_insert_with(|| {
                    nodes.push(FlameNode {
                        label: label.clone(),
                        bytes: 0,
                        children: Vec::new(),
                    });
                    let id = nodes.len() - 1;
                    nodes[at].children.push(id);
                    id
                });
                nodes[next].bytes = nodes[next].bytes.saturating_add(bytes);
                at = next;
            }
        }
        let bytes: Vec<u64> = nodes.iter().map(|n| n.bytes).collect();
        for n in &mut nodes {
            n.children
                .sort_by(|a, b| bytes[*b].cmp(&bytes[*a]).then(a.cmp(b)));
        }
        Self { nodes }
    }

    /// The root's bytes: everything live at the moment.
    pub fn total_bytes(&self) -> u64 {
        self.nodes[0].bytes
    }

    /// The cells under the root, depth first, largest child first; cells narrower than
    /// `min_width` (a fraction of the total) are left out with everything under them (their
    /// bytes still count in their parent's width).
    pub fn cells(&self, min_width: f64) -> Vec<Cell> {
        let mut out = Vec::new();
        let total = self.total_bytes();
        if total == 0 {
            return out;
        }
        // (node, depth, start)
        let mut todo: Vec<(usize, u32, f64)> = Vec::new();
        let mut start = 0.0;
        for &c in &self.nodes[0].children {
            todo.push((c, 0, start));
            start += self.nodes[c].bytes as f64 / total as f64;
        }
        todo.reverse();
        while let Some((id, depth, start)) = todo.pop() {
            let n = &self.nodes[id];
            let width = n.bytes as f64 / total as f64;
            if width < min_width {
                continue;
            }
            out.push(Cell {
                depth,
                start,
                width,
                label: n.label.clone(),
                bytes: n.bytes,
            });
            let mut children = Vec::with_capacity(n.children.len());
            let mut s = start;
            for &c in &n.children {
                children.push((c, depth + 1, s));
                s += self.nodes[c].bytes as f64 / total as f64;
            }
            todo.extend(children.into_iter().rev());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(s: &[&str]) -> Vec<String> {
        s.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn stacks_merge_from_the_outermost_frame() {
        // Innermost first: two allocations under main -> train, one under main -> eval.
        let a = frames(&["alloc", "forward", "train", "main"]);
        let b = frames(&["grad", "backward", "train", "main"]);
        let c = frames(&["alloc", "eval", "main"]);
        let d: Vec<String> = Vec::new();
        let f = Flame::from_stacks([(&a[..], 600), (&b[..], 300), (&c[..], 100), (&d[..], 24)]);
        assert_eq!(f.total_bytes(), 1024);
        let cells = f.cells(0.0);
        let by = |label: &str, depth: u32| {
            cells
                .iter()
                .find(|c| c.label == label && c.depth == depth)
                .unwrap_or_else(|| panic!("{label} at {depth}"))
                .clone()
        };
        assert_eq!(by("main", 0).bytes, 1000);
        assert_eq!(by(NO_STACK, 0).bytes, 24);
        assert_eq!(by("train", 1).bytes, 900);
        assert_eq!(by("eval", 1).bytes, 100);
        // The same function under two parents is two cells.
        assert_eq!(by("alloc", 3).bytes, 600);
        assert_eq!(by("alloc", 2).bytes, 100);
        // Children sit inside their parent, largest first, side by side.
        let (train, eval) = (by("train", 1), by("eval", 1));
        assert!((train.start - by("main", 0).start).abs() < 1e-12);
        assert!((eval.start - (train.start + train.width)).abs() < 1e-12);
        let fwd = by("forward", 2);
        let bwd = by("backward", 2);
        assert!(fwd.start < bwd.start);
        assert!((fwd.width + bwd.width - train.width).abs() < 1e-12);
        // Depth-first order: a cell's children follow it.
        let main_at = cells.iter().position(|c| c.label == "main").expect("main");
        assert_eq!(cells[main_at + 1].label, "train");
    }

    #[test]
    fn narrow_cells_are_left_out_with_what_is_under_them() {
        let big = frames(&["a", "root"]);
        let small = frames(&["b", "tiny", "root"]);
        let f = Flame::from_stacks([(&big[..], 999), (&small[..], 1)]);
        let cells = f.cells(0.01);
        assert_eq!(
            cells.iter().map(|c| c.label.as_str()).collect::<Vec<_>>(),
            ["root", "a"]
        );
        assert_eq!(cells[0].bytes, 1000, "the parent still counts them");
        assert!(Flame::from_stacks(std::iter::empty()).cells(0.0).is_empty());
    }
}
