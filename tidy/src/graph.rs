//! The imports between a crate's files: each path a file names, followed through re-exports to
//! the file that defines it; and the circles they make.

use std::collections::BTreeSet;

use crate::modules::{Crate, ModPath};

/// How many re-exports a path is followed through.
const MAX_HOPS: usize = 8;

/// The files each file imports (by index), itself left out; `mod.rs` (or the root) to the
/// modules it declares included.
pub(crate) fn imports(krate: &Crate) -> Vec<BTreeSet<usize>> {
    krate
        .files
        .iter()
        .enumerate()
        .map(|(index, file)| {
            let named = file.named.iter().chain(&file.children);
            named
                .filter_map(|path| resolve(krate, path, 0))
                .filter(|target| *target != index)
                .collect()
        })
        .collect()
}

/// The file that defines what `path` names, through the re-exports on the way.
fn resolve(krate: &Crate, path: &[String], hops: usize) -> Option<usize> {
    let (module_len, module) = (0..=path.len())
        .rev()
        .find_map(|len| krate.modules.get(&path[..len]).map(|m| (len, m)))?;
    let rest = &path[module_len..];
    let Some(name) = rest.first() else {
        return Some(module.file);
    };
    if module.defines.contains(name) || hops >= MAX_HOPS {
        return Some(module.file);
    }
    match module.imports.get(name) {
        Some(Some(target)) => {
            let mut whole: ModPath = target.clone();
            whole.extend(rest[1..].iter().cloned());
            resolve(krate, &whole, hops + 1).or(Some(module.file))
        }
        _ => Some(module.file),
    }
}

/// The circles of `edges`: each group of two or more files that reach one another (Tarjan's
/// strongly connected components).
pub(crate) fn circles(edges: &[BTreeSet<usize>]) -> Vec<Vec<usize>> {
    struct State<'a> {
        edges: &'a [BTreeSet<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        found: Vec<Vec<usize>>,
    }
    fn visit(state: &mut State<'_>, node: usize) {
        state.index[node] = Some(state.next);
        state.low[node] = state.next;
        state.next += 1;
        state.stack.push(node);
        state.on_stack[node] = true;
        for &to in &state.edges[node] {
            match state.index[to] {
                None => {
                    visit(state, to);
                    state.low[node] = state.low[node].min(state.low[to]);
                }
                Some(index) if state.on_stack[to] => state.low[node] = state.low[node].min(index),
                Some(_) => {}
            }
        }
        if Some(state.low[node]) == state.index[node] {
            let mut group = Vec::new();
            while let Some(top) = state.stack.pop() {
                state.on_stack[top] = false;
                group.push(top);
                if top == node {
                    break;
                }
            }
            if group.len() > 1 {
                group.sort_unstable();
                state.found.push(group);
            }
        }
    }
    let count = edges.len();
    let mut state = State {
        edges,
        index: vec![None; count],
        low: vec![0; count],
        on_stack: vec![false; count],
        stack: Vec::new(),
        next: 0,
        found: Vec::new(),
    };
    for node in 0..count {
        if state.index[node].is_none() {
            visit(&mut state, node);
        }
    }
    state.found
}

/// How many floors `edges` stand on: the longest chain of imports, counted in files.
pub(crate) fn floors(edges: &[BTreeSet<usize>]) -> usize {
    fn height(
        node: usize,
        edges: &[BTreeSet<usize>],
        memo: &mut [Option<usize>],
        seen: &mut [bool],
    ) -> usize {
        if let Some(known) = memo[node] {
            return known;
        }
        if seen[node] {
            return 0;
        }
        seen[node] = true;
        let below = (edges[node].iter())
            .map(|&to| height(to, edges, memo, seen))
            .max()
            .unwrap_or(0);
        memo[node] = Some(below + 1);
        below + 1
    }
    let mut memo = vec![None; edges.len()];
    let mut seen = vec![false; edges.len()];
    (0..edges.len())
        .map(|node| height(node, edges, &mut memo, &mut seen))
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_planted_circle_is_found() {
        let edges = vec![
            BTreeSet::from([1]),
            BTreeSet::from([2]),
            BTreeSet::from([0]),
            BTreeSet::from([0]),
        ];
        assert_eq!(circles(&edges), vec![vec![0, 1, 2]]);
        let straight = vec![BTreeSet::from([1]), BTreeSet::from([2]), BTreeSet::new()];
        assert!(circles(&straight).is_empty());
        assert_eq!(floors(&straight), 3);
    }
}
