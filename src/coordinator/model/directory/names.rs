//! Interned names of the key directory (instance ids, backends, salts): `u32` indices,
//! counted references, a freed index reused, at most `max` live names.

use hashbrown::HashMap;

#[derive(Debug, Default)]
pub(super) struct Names {
    pub(super) names: Vec<String>,
    refs: Vec<u32>,
    by: HashMap<String, u32>,
    free: Vec<u32>,
    max: usize,
}

impl Names {
    pub(super) fn new(max: usize) -> Self {
        Names {
            max,
            ..Names::default()
        }
    }

    /// The index of `s`, interned (with no reference yet) if new; `None` at the limit.
    pub(super) fn intern(&mut self, s: &str) -> Option<u32> {
        if let Some(&i) = self.by.get(s) {
            return Some(i);
        }
        if self.by.len() >= self.max {
            return None;
        }
        let i = match self.free.pop() {
            Some(i) => {
                self.names[i as usize] = s.to_owned();
                i
            }
            None => {
                self.names.push(s.to_owned());
                self.refs.push(0);
                u32::try_from(self.names.len() - 1).ok()?
            }
        };
        self.by.insert(s.to_owned(), i);
        Some(i)
    }

    pub(super) fn get(&self, s: &str) -> Option<u32> {
        self.by.get(s).copied()
    }

    pub(super) fn name(&self, i: u32) -> &str {
        self.names.get(i as usize).map_or("", String::as_str)
    }

    pub(super) fn hold(&mut self, i: u32) {
        if let Some(r) = self.refs.get_mut(i as usize) {
            *r += 1;
        }
    }

    pub(super) fn release(&mut self, i: u32) {
        if let Some(r) = self.refs.get_mut(i as usize) {
            *r = r.saturating_sub(1);
        }
        self.release_if_unused(i);
    }

    /// Frees `i` if nothing refers to it.
    pub(super) fn release_if_unused(&mut self, i: u32) {
        if self.refs.get(i as usize) != Some(&0) {
            return;
        }
        let name = std::mem::take(&mut self.names[i as usize]);
        if self.by.remove(&name).is_some() {
            self.free.push(i);
        }
    }
}
