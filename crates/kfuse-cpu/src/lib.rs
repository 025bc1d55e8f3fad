//! The kfuse CPU backend. Today: the tile interpreter, which runs kernel IR directly.

pub mod tile;
