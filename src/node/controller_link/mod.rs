//! The node as a controller's LMCache worker (`--controller-pull`, `--controller-reply`):
//! what each tier holds reported through `kvplane::worker` (`report`), the controller's
//! commands answered (`commands`), and `/move`'s PUTs to another node over `lm://` (`peer`).

pub(crate) mod commands;
mod peer;
pub(crate) mod report;
