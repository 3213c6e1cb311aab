//! A small explicit-state model checker: breadth-first search over every state a [`Model`]
//! reaches, each state stored once by its fingerprint, its properties checked in each.
//!
//! Three kinds of property, as in TLA+ and stateright:
//! - [`Expectation::Always`]: holds in every reachable state; a state where it fails is a
//!   counterexample.
//! - [`Expectation::Sometimes`]: holds in some reachable state; the first such state is an
//!   example, and none means the model never does what the property names (it is vacuous).
//! - [`Expectation::Eventually`]: holds in every terminal state (one where no action is
//!   enabled), so every run of the model that ends, ends with it. Runs that go round a cycle
//!   forever (a message requeued while a live claim holds its key) are not checked by it.
//!
//! Breadth-first, so the path to each discovery is a shortest one. Only fingerprints and each
//! state's parent fingerprint are kept besides the frontier; a path is rebuilt by running the
//! model again from its initial state (as stateright does).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt::{self, Debug, Write as _};
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

/// A system to check: its initial states, the actions enabled in a state, what each does, and
/// the properties to check.
pub trait Model: Sized {
    /// A state of the whole system.
    type State: Clone + Hash + Eq + Debug;
    /// One step that some part of the system (or its environment) can take.
    type Action: Clone + Debug;

    /// The states the system starts in.
    fn init_states(&self) -> Vec<Self::State>;

    /// Pushes onto `actions` every action enabled in `state`.
    fn actions(&self, state: &Self::State, actions: &mut Vec<Self::Action>);

    /// The state `action` leads to from `state`; `None` when it changes nothing.
    fn next_state(&self, state: &Self::State, action: &Self::Action) -> Option<Self::State>;

    /// The properties to check.
    fn properties(&self) -> Vec<Property<Self>>;
}

/// What a property expects of the reachable states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expectation {
    /// In every reachable state.
    Always,
    /// In at least one reachable state.
    Sometimes,
    /// In every terminal state.
    Eventually,
}

/// A named condition on states, with what is expected of it.
pub struct Property<M: Model> {
    /// What is expected of the condition.
    pub expectation: Expectation,
    /// The property's name, as reports and tests refer to it.
    pub name: &'static str,
    /// The condition, on a state of the model.
    pub condition: fn(&M, &M::State) -> bool,
}

impl<M: Model> Property<M> {
    /// A condition expected in every reachable state.
    pub fn always(name: &'static str, condition: fn(&M, &M::State) -> bool) -> Self {
        Self {
            expectation: Expectation::Always,
            name,
            condition,
        }
    }

    /// A condition expected in some reachable state.
    pub fn sometimes(name: &'static str, condition: fn(&M, &M::State) -> bool) -> Self {
        Self {
            expectation: Expectation::Sometimes,
            name,
            condition,
        }
    }

    /// A condition expected in every terminal state.
    pub fn eventually(name: &'static str, condition: fn(&M, &M::State) -> bool) -> Self {
        Self {
            expectation: Expectation::Eventually,
            name,
            condition,
        }
    }
}

impl<M: Model> Debug for Property<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Property")
            .field("expectation", &self.expectation)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// How far a check goes.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The most distinct states explored; past it the check is incomplete.
    pub max_states: usize,
    /// Stop as soon as the property of this name has a discovery (a counterexample for an
    /// `Always` or `Eventually` property): for checks that expect one.
    pub stop_at: Option<&'static str>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_states: 20_000_000,
            stop_at: None,
        }
    }
}

/// A path through the model: the actions from an initial state, and the states they reach.
#[derive(Clone)]
pub struct Path<M: Model> {
    /// The initial state.
    pub init: M::State,
    /// Each action and the state it led to.
    pub steps: Vec<(M::Action, M::State)>,
}

impl<M: Model> Path<M> {
    /// The state the path ends in.
    pub fn last_state(&self) -> &M::State {
        self.steps.last().map_or(&self.init, |(_, state)| state)
    }
}

impl<M: Model> fmt::Display for Path<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (number, (action, _)) in self.steps.iter().enumerate() {
            writeln!(f, "{:>3}. {action:?}", number + 1)?;
        }
        write!(f, "     final state: {:?}", self.last_state())
    }
}

impl<M: Model> Debug for Path<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// What a check found.
pub struct Report<M: Model> {
    /// Distinct states reached.
    pub states: usize,
    /// Transitions followed (to new states or not).
    pub transitions: usize,
    /// The length of the longest shortest path to a state.
    pub depth: usize,
    /// States where no action is enabled (where `Eventually` properties are checked).
    pub terminal: usize,
    /// How long the check took.
    pub elapsed: Duration,
    /// Whether every reachable state was explored.
    pub complete: bool,
    properties: Vec<(&'static str, Expectation)>,
    discoveries: BTreeMap<&'static str, Path<M>>,
}

impl<M: Model> Report<M> {
    /// Whether the named property holds: no counterexample (`Always`, `Eventually`), or an
    /// example found (`Sometimes`). A property cannot be said to hold of an incomplete check,
    /// except a `Sometimes` property that was found.
    ///
    /// # Panics
    ///
    /// No property has this name.
    pub fn holds(&self, name: &str) -> bool {
        let (_, expectation) = self.property(name);
        let found = self.discoveries.contains_key(name);
        match expectation {
            Expectation::Sometimes => found,
            Expectation::Always | Expectation::Eventually => self.complete && !found,
        }
    }

    /// The discovery for the named property: its counterexample (`Always`, `Eventually`) or
    /// its example (`Sometimes`).
    pub fn discovery(&self, name: &str) -> Option<&Path<M>> {
        self.discoveries.get(name)
    }

    /// The names of the properties checked.
    pub fn property_names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.properties.iter().map(|(name, _)| *name)
    }

    /// Panics, printing every failing property's counterexample, unless the check was complete
    /// and every property holds.
    pub fn assert_properties(&self) {
        let mut failures = String::new();
        if !self.complete {
            failures.push_str("the check stopped before exploring every state\n");
        }
        let eventually = (self.properties.iter()).any(|(_, e)| *e == Expectation::Eventually);
        if eventually && self.terminal == 0 {
            failures.push_str("no run ends: every `Eventually` property holds vacuously\n");
        }
        for (name, expectation) in &self.properties {
            if self.holds(name) {
                continue;
            }
            match self.discoveries.get(name) {
                Some(path) => {
                    let _ = writeln!(failures, "{name} fails ({expectation:?}):\n{path}");
                }
                None => {
                    let _ = writeln!(failures, "{name} was never reached ({expectation:?})");
                }
            }
        }
        assert!(failures.is_empty(), "{failures}\n{self}");
    }

    fn property(&self, name: &str) -> (&'static str, Expectation) {
        *self
            .properties
            .iter()
            .find(|(known, _)| *known == name)
            .unwrap_or_else(|| panic!("no property named {name:?}"))
    }
}

impl<M: Model> fmt::Display for Report<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} states ({} terminal), {} transitions, depth {}, {:.2?}{}",
            self.states,
            self.terminal,
            self.transitions,
            self.depth,
            self.elapsed,
            if self.complete { "" } else { " (incomplete)" }
        )?;
        for (name, _) in &self.properties {
            let verdict = if self.holds(name) { "holds" } else { "FAILS" };
            write!(f, "\n  {verdict:>5}: {name}")?;
        }
        Ok(())
    }
}

impl<M: Model> Debug for Report<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Explores every state of `model` reachable within `limits`, checking its properties.
pub fn check<M: Model>(model: &M, limits: Limits) -> Report<M> {
    let started = Instant::now();
    let properties = model.properties();
    // Each state's fingerprint, with its parent's (none for an initial state).
    let mut parents: HashMap<u64, Option<u64>> = HashMap::new();
    let mut frontier: VecDeque<(M::State, u64, usize)> = VecDeque::new();
    let mut found: BTreeMap<&'static str, u64> = BTreeMap::new();
    for state in model.init_states() {
        let print = fingerprint(&state);
        if parents.insert(print, None).is_none() {
            frontier.push_back((state, print, 0));
        }
    }
    let mut transitions = 0;
    let mut terminal_states = 0;
    let mut depth = 0;
    let mut complete = true;
    let mut actions = Vec::new();
    while let Some((state, print, at)) = frontier.pop_front() {
        depth = depth.max(at);
        discover_in_state(model, &properties, &state, print, &mut found);
        if limits.stop_at.is_some_and(|name| found.contains_key(name)) {
            complete = false;
            break;
        }
        actions.clear();
        model.actions(&state, &mut actions);
        let mut terminal = true;
        for action in &actions {
            let Some(next) = model.next_state(&state, action) else {
                continue;
            };
            terminal = false;
            transitions += 1;
            let next_print = fingerprint(&next);
            if parents.contains_key(&next_print) {
                continue;
            }
            parents.insert(next_print, Some(print));
            frontier.push_back((next, next_print, at + 1));
        }
        if terminal {
            terminal_states += 1;
            discover_at_end(model, &properties, &state, print, &mut found);
        }
        if parents.len() > limits.max_states {
            complete = false;
            break;
        }
    }
    let discoveries = found
        .into_iter()
        .map(|(name, print)| (name, rebuild(model, &parents, print)))
        .collect();
    Report {
        states: parents.len(),
        transitions,
        depth,
        terminal: terminal_states,
        elapsed: started.elapsed(),
        complete,
        properties: properties.iter().map(|p| (p.name, p.expectation)).collect(),
        discoveries,
    }
}

/// Records, under `print`, each property that `state` shows: an `Always` it breaks, a
/// `Sometimes` it reaches.
fn discover_in_state<M: Model>(
    model: &M,
    properties: &[Property<M>],
    state: &M::State,
    print: u64,
    found: &mut BTreeMap<&'static str, u64>,
) {
    for property in properties {
        if found.contains_key(property.name) {
            continue;
        }
        let discovered = match property.expectation {
            Expectation::Always => !(property.condition)(model, state),
            Expectation::Sometimes => (property.condition)(model, state),
            Expectation::Eventually => false,
        };
        if discovered {
            found.insert(property.name, print);
        }
    }
}

/// Records, under `print`, each `Eventually` that a terminal `state` ends without.
fn discover_at_end<M: Model>(
    model: &M,
    properties: &[Property<M>],
    state: &M::State,
    print: u64,
    found: &mut BTreeMap<&'static str, u64>,
) {
    for property in properties {
        let violated = property.expectation == Expectation::Eventually
            && !found.contains_key(property.name)
            && !(property.condition)(model, state);
        if violated {
            found.insert(property.name, print);
        }
    }
}

/// The path to the state of fingerprint `target`, found again by running the model along the
/// chain of parents.
fn rebuild<M: Model>(model: &M, parents: &HashMap<u64, Option<u64>>, target: u64) -> Path<M> {
    let mut chain = vec![target];
    while let Some(Some(parent)) = parents.get(chain.last().expect("not empty")) {
        chain.push(*parent);
    }
    chain.reverse();
    let init = model
        .init_states()
        .into_iter()
        .find(|state| fingerprint(state) == chain[0])
        .expect("the chain starts at an initial state");
    let mut path = Path {
        init,
        steps: Vec::new(),
    };
    let mut actions = Vec::new();
    for next_print in &chain[1..] {
        actions.clear();
        model.actions(path.last_state(), &mut actions);
        let step = actions
            .iter()
            .find_map(|action| {
                let next = model.next_state(path.last_state(), action)?;
                (fingerprint(&next) == *next_print).then(|| (action.clone(), next))
            })
            .expect("some action leads to the next state of the chain");
        path.steps.push(step);
    }
    path
}

/// A state's 64-bit fingerprint (FNV-1a over its `Hash`).
fn fingerprint<T: Hash>(value: &T) -> u64 {
    let mut hasher = Fnv(0xcbf2_9ce4_8422_2325);
    value.hash(&mut hasher);
    hasher.finish()
}

/// FNV-1a: quick, deterministic from run to run, and enough for the few million states a check
/// explores.
struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        // A final mix, so that states differing in their last bytes spread over the table.
        let mut x = self.0;
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two processes each incrementing a shared counter by a read then a write: the classic
    /// lost update.
    struct Increments;

    #[derive(Clone, Debug, Hash, PartialEq, Eq)]
    struct Counter {
        value: u8,
        read: [Option<u8>; 2],
        done: [bool; 2],
    }

    impl Model for Increments {
        type State = Counter;
        type Action = (usize, bool);

        fn init_states(&self) -> Vec<Counter> {
            vec![Counter {
                value: 0,
                read: [None; 2],
                done: [false; 2],
            }]
        }

        fn actions(&self, state: &Counter, actions: &mut Vec<(usize, bool)>) {
            for process in 0..2 {
                if !state.done[process] {
                    actions.push((process, state.read[process].is_some()));
                }
            }
        }

        fn next_state(
            &self,
            state: &Counter,
            &(process, write): &(usize, bool),
        ) -> Option<Counter> {
            let mut next = state.clone();
            if write {
                next.value = next.read[process].take()? + 1;
                next.done[process] = true;
            } else {
                next.read[process] = Some(next.value);
            }
            Some(next)
        }

        fn properties(&self) -> Vec<Property<Self>> {
            vec![
                Property::eventually("both increments count", |_, s: &Counter| s.value == 2),
                Property::sometimes("one process finishes", |_, s: &Counter| s.done[0]),
                Property::always("at most two", |_, s: &Counter| s.value <= 2),
            ]
        }
    }

    #[test]
    fn finds_the_lost_update_with_a_shortest_path() {
        let report = check(&Increments, Limits::default());
        assert!(report.complete);
        assert!(report.holds("at most two"));
        assert!(report.holds("one process finishes"));
        assert!(!report.holds("both increments count"));
        let path = report
            .discovery("both increments count")
            .expect("a counterexample");
        assert_eq!(path.steps.len(), 4);
        assert_eq!(path.last_state().value, 1);
    }
}
