//! How leaking causes become findings: one per cause, named by the frame that names it best.

use alloc::vec::Vec;
use hashbrown::HashMap;

use super::Config;
use super::causes::Causes;
use crate::format::StackId;
use crate::model::{FrameView, TraceModel};

/// Where a line leaks on some paths only (the model's head allocates under evaluation and under
/// training, but only what evaluation keeps stays), the first frame of a leaking path that no
/// other path of the line passes through names the cause better than the line.
pub(crate) fn separating_frame(
    m: &TraceModel,
    c: &Config,
    ci: usize,
    leak_stacks: &[(usize, StackId)],
    stacks_by_line: &HashMap<usize, Vec<StackId>>,
) -> Option<FrameView> {
    let chain = |stack: StackId| -> Vec<FrameView> {
        let frames = m.stack_frames(stack);
        crate::attribution::user_frame_indexes(&frames, &c.hide_frames)
            .into_iter()
            .map(|i| frames[i].clone())
            .collect()
    };
    let all = stacks_by_line.get(&ci)?;
    let leaking: Vec<StackId> = all
        .iter()
        .copied()
        .filter(|s| leak_stacks.binary_search(&(ci, *s)).is_ok())
        .collect();
    let others: Vec<Vec<FrameView>> = all
        .iter()
        .copied()
        .filter(|s| !leaking.contains(s))
        .map(chain)
        .collect();
    if others.is_empty() || leaking.is_empty() {
        return None;
    }
    let mut found: Option<FrameView> = None;
    for s in leaking {
        let path = chain(s);
        // Skip the line itself; stop short of the script's entry.
        let inner = path.len().saturating_sub(1);
        let f = path
            .get(1..inner)?
            .iter()
            .find(|f| !others.iter().any(|o| o.contains(f)))?
            .clone();
        // Every leaking path must agree on it.
        if found.as_ref().is_some_and(|g| *g != f) {
            return None;
        }
        found = Some(f);
    }
    found
}

/// Leaking causes grouped into findings, with the frame they meet in where that names the
/// cause better than any one line. Lines of one function, on every device and in every process
/// (workers running the same code), are one cause; so is a line whose frame every stack of the
/// group passes through the function of (the training step that calls the model at one line
/// and keeps its result, made at the next: the statements of `forward` that leak are its
/// graph), and the line of that function the group's stacks pass through names the group.
pub(crate) fn group_causes(
    m: &TraceModel,
    c: &Config,
    causes: &Causes,
    leaking: &[usize],
    weak: &[(usize, Vec<(usize, StackId)>)],
    leak_stacks: &[(usize, StackId)],
) -> Vec<(Vec<usize>, Option<FrameView>)> {
    let chain = |ci: usize| -> Vec<FrameView> {
        let stack = leak_stacks
            .iter()
            .find(|(c2, _)| *c2 == ci)
            .map_or(causes.top_stack[ci].0, |x| x.1);
        let frames = m.stack_frames(stack);
        crate::attribution::user_frame_indexes(&frames, &c.hide_frames)
            .into_iter()
            .map(|i| frames[i].clone())
            .collect()
    };
    let mut groups: Vec<(Vec<usize>, Option<FrameView>)> = Vec::new();
    let mut done: Vec<bool> = alloc::vec![false; leaking.len()];
    for x in 0..leaking.len() {
        if done[x] {
            continue;
        }
        let ci = leaking[x];
        let host = causes.keys[ci].2;
        let func = &causes.functions[ci];
        let mut members = alloc::vec![ci];
        for y in x + 1..leaking.len() {
            let cj = leaking[y];
            // Python statements of one function are causes of their own (a list and a cache
            // of one training step leak for different reasons); C++ lines of one function are
            // one cause (the buffers a function sets up and never frees).
            let same = if func.1.is_empty() || causes.python[ci] || causes.python[cj] {
                causes.keys[cj].3 == causes.keys[ci].3
            } else {
                causes.functions[cj] == *func
            };
            if !done[y] && causes.keys[cj].2 == host && same {
                members.push(cj);
                done[y] = true;
            }
        }
        groups.push((members, None));
    }
    // A caller's line that every stack of a group passes through (leaking or growing weakly)
    // joins it and names it; groups under the same caller's line become one.
    // A Python statement that leaks on its own (a list of new tensors) is its own cause, never
    // the caller's line of another's (the graph a previous statement keeps).
    let callers: Vec<(usize, FrameView)> = leaking
        .iter()
        .copied()
        .filter(|&ci| !causes.python[ci])
        .chain(weak.iter().map(|w| w.0))
        .filter_map(|ci| chain(ci).into_iter().next().map(|f| (ci, f)))
        .collect();
    let chains: Vec<Vec<Vec<FrameView>>> = groups
        .iter()
        .map(|(members, _)| members.iter().map(|&ci| chain(ci)).collect())
        .collect();
    for (g, (members, common)) in groups.iter_mut().enumerate() {
        let host = causes.keys[members[0]].2;
        // The outermost such function (nearest the script's entry, short of the entry itself),
        // named by the line of it the group's stacks pass through.
        let mut best: Option<(usize, usize, FrameView)> = None; // (depth from outside, cause, frame)
        for (ci, frame) in &callers {
            if members.contains(ci) || causes.keys[*ci].2 != host {
                continue;
            }
            let same_function =
                |f: &FrameView| f.file == frame.file && f.function == frame.function;
            let mut all = true;
            let mut d = usize::MAX;
            let mut named: Option<FrameView> = None;
            for ch in &chains[g] {
                let outer = ch.len().saturating_sub(1);
                // A caller: never the frame that allocates.
                match ch[..outer]
                    .iter()
                    .skip(1)
                    .position(same_function)
                    .map(|p| p + 1)
                {
                    Some(p) => {
                        d = d.min(outer - p);
                        named.get_or_insert_with(|| ch[p].clone());
                    }
                    None => all = false,
                }
            }
            if let (true, Some(named)) = (all, named)
                && best.as_ref().is_none_or(|b| d < b.0)
            {
                best = Some((d, *ci, named));
            }
        }
        if let Some((_, ci, frame)) = best {
            members.push(ci);
            *common = Some(frame);
        }
    }
    // Groups that now share a member (two leaking functions under one caller) are one.
    let mut out: Vec<(Vec<usize>, Option<FrameView>)> = Vec::new();
    for (members, common) in groups {
        match out.iter_mut().find(|(m2, c2)| {
            common.is_some() && *c2 == common && m2.iter().any(|x| members.contains(x))
        }) {
            Some((m2, _)) => {
                for x in members {
                    if !m2.contains(&x) {
                        m2.push(x);
                    }
                }
            }
            None => out.push((members, common)),
        }
    }
    out
}
