//! Scenarios: a customer of a generated database, what they want (hidden from the agent, shown
//! to the user simulator), the actions that fulfil it and the facts the agent must tell them.
//! The reward, as τ-bench defines it: replay the scenario's actions on a fresh copy of the
//! database and compare it with the database the agent left; and every required fact must appear
//! in what the agent said to the customer.

use super::db::{Address, Database};
use super::tools;
use ooze_core::SplitMix64;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// How the customer identifies themselves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "by", rename_all = "snake_case")]
pub enum Identity {
    Email {
        email: String,
    },
    NameZip {
        first_name: String,
        last_name: String,
        zip: String,
    },
}

/// What the customer wants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Request {
    Cancel {
        order_id: String,
        reason: String,
    },
    OrderAddress {
        order_id: String,
        address: Address,
    },
    UserAddress {
        address: Address,
    },
    Return {
        order_id: String,
        item_id: String,
        /// The original payment method or a gift card.
        payment_method_id: String,
    },
    Exchange {
        order_id: String,
        item_id: String,
        product_id: String,
        /// The option that changes and its new value.
        option: String,
        value: String,
        new_item_id: String,
        payment_method_id: String,
    },
    OrderTotal {
        order_id: String,
    },
}

/// One tool call of a scenario's solution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Action {
    pub name: String,
    pub arguments: Map<String, Value>,
}

/// A task of the simulated-user environment (a dataset row's metadata).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Scenario {
    /// The database it runs on: [`Database::generate`] of this.
    pub db_seed: u64,
    pub user_id: String,
    pub identity: Identity,
    pub request: Request,
    /// What the user simulator is told (its hidden goal).
    pub instruction: String,
    /// The changes that fulfil the request (none for a question).
    pub actions: Vec<Action>,
    /// Facts the agent must tell the customer.
    pub outputs: Vec<String>,
}

pub(super) fn action(name: &str, arguments: Value) -> Action {
    Action {
        name: name.to_owned(),
        arguments: arguments.as_object().expect("an object").clone(),
    }
}

pub(super) fn describe(options: &std::collections::BTreeMap<String, String>) -> String {
    options
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Scenario {
    /// The scenario of `seed` (its database is generated from the same seed).
    pub fn generate(seed: u64) -> Scenario {
        let db = Database::generate(seed);
        let mut rng = SplitMix64::new(seed ^ 0x5ce7_a710);
        loop {
            if let Some(s) = super::draw::scenario(&db, seed, &mut rng) {
                return s;
            }
        }
    }

    /// The scenario of a dataset row's metadata.
    pub fn from_metadata(metadata: &Value) -> Result<Scenario, String> {
        let value = metadata.get("scenario").unwrap_or(metadata);
        serde_json::from_value(value.clone()).map_err(|e| {
            format!(
                "a tau_retail row's metadata (data.metadata_key) holds its scenario under \
                 \"scenario\" (db_seed, user_id, identity, request, instruction, actions, \
                 outputs): {e}"
            )
        })
    }

    /// The database after the scenario's actions: what the agent should leave.
    pub fn goal_database(&self) -> Result<Database, String> {
        let mut db = Database::generate(self.db_seed);
        for a in &self.actions {
            tools::call(&mut db, &a.name, &a.arguments)
                .map_err(|e| format!("the scenario's action {} is refused: {e}", a.name))?;
        }
        Ok(db)
    }

    /// Grades an episode: the database the agent left and everything it said to the customer.
    pub fn grade(&self, db: &Database, said: &[String]) -> Result<Grade, String> {
        let database_matches = *db == self.goal_database()?;
        let outputs_found = self
            .outputs
            .iter()
            .filter(|o| {
                let bare = o.trim_start_matches('$');
                said.iter().any(|s| s.contains(bare))
            })
            .count();
        Ok(Grade {
            database_matches,
            outputs_found,
            outputs: self.outputs.len(),
        })
    }
}

/// How an episode did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grade {
    pub database_matches: bool,
    pub outputs_found: usize,
    pub outputs: usize,
}

impl Grade {
    /// τ-bench's reward: 1 when the database matches and every required fact was said.
    pub fn reward(&self) -> f64 {
        (self.database_matches && self.outputs_found == self.outputs) as u8 as f64
    }
}

/// The marker the user simulator ends the conversation with.
pub const STOP: &str = "###STOP###";

/// The agent's greeting, the user simulator's first prompt.
pub const GREETING: &str = "Hi! How can I help you today?";

/// The user simulator's system prompt around its hidden instruction.
pub fn user_system_prompt(instruction: &str) -> String {
    format!(
        "You are a customer writing to an online store's customer service agent. {instruction}\n\
         Write one short message per turn, as the customer. Say what you want and give the \
         details the agent asks for. Say yes when the agent asks you to confirm something you \
         want. When your request is done or cannot be done, thank the agent and end with {STOP}."
    )
}

/// The policy document: the store's rules and the tools (the rows' system prompt).
pub fn policy_document() -> String {
    format!(
        "You are a store's customer service agent. First find the customer's user id (by email, \
         or by name and zip). Pending orders can be cancelled (reason \"no longer needed\" or \
         \"ordered by mistake\") or sent to a new address; items of delivered orders can be \
         returned (refund to the original payment method or a gift card) or exchanged for an \
         available variant of the same product. Before a change, say what you will do and ask \
         the customer to confirm. Call one tool at a time as <tool_call>{{\"name\": ..., \
         \"arguments\": {{...}}}}</tool_call>. Tools: {}.",
        tools::tools_text()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_scenario_is_solvable_and_needs_its_actions() {
        let mut kinds = std::collections::HashSet::new();
        for seed in 0..300 {
            let s = Scenario::generate(seed);
            assert_eq!(s, Scenario::generate(seed));
            let back = Scenario::from_metadata(&json!({"scenario": s})).unwrap();
            assert_eq!(back, s);
            kinds.insert(std::mem::discriminant(&s.request));
            let goal = s.goal_database().unwrap();
            let fresh = Database::generate(s.db_seed);
            // The solution earns 1; doing nothing earns 0 (a question's facts must be said).
            let all_said: Vec<String> = s.outputs.clone();
            assert_eq!(s.grade(&goal, &all_said).unwrap().reward(), 1.0, "{s:?}");
            assert_eq!(s.grade(&fresh, &[]).unwrap().reward(), 0.0, "{s:?}");
            assert_eq!(s.actions.is_empty(), !s.outputs.is_empty(), "{s:?}");
        }
        assert_eq!(kinds.len(), 6, "every kind of request is drawn");
        let e = Scenario::from_metadata(&json!({"scenario": {"db_seed": 1}})).unwrap_err();
        assert!(
            e.contains("missing field") && e.contains("\"scenario\""),
            "{e}"
        );
    }
}
