//! A simulated-user tool environment in τ-bench's shape (retail): a generated store database,
//! tools that read and change it, scenarios that give a user simulator a hidden goal, and the
//! reward that compares the database the agent left with the one the goal asks for.
//!
//! - [`db`]: the database (users, products with variants, orders with payments), from a seed.
//! - [`tools`]: the agent's tools and the store's rules they enforce.
//! - `draw`: a customer and a request drawn from a database, with its solution.
//! - [`scenario`]: customers' requests, their solutions, the grading, the user simulator's and
//!   the agent's prompts.

pub mod db;
mod draw;
pub mod scenario;
pub mod tools;

pub use db::Database;
pub use scenario::{Grade, Scenario};
