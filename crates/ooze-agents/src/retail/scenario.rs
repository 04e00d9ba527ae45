//! Scenarios: a customer of a generated database, what they want (hidden from the agent, shown
//! to the user simulator), the actions that fulfil it and the facts the agent must tell them.
//! The reward, as τ-bench defines it: replay the scenario's actions on a fresh copy of the
//! database and compare it with the database the agent left; and every required fact must appear
//! in what the agent said to the customer.

use super::db::{dollars, Address, Database};
use super::tools::{self, CANCEL_REASONS};
use ooze_core::SplitMix64;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

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

fn action(name: &str, arguments: Value) -> Action {
    Action {
        name: name.to_owned(),
        arguments: arguments.as_object().expect("an object").clone(),
    }
}

fn describe(options: &std::collections::BTreeMap<String, String>) -> String {
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
            if let Some(s) = Self::attempt(&db, seed, &mut rng) {
                return s;
            }
        }
    }

    /// One draw of a customer and a request; `None` when the drawn customer has nothing the
    /// drawn request applies to.
    fn attempt(db: &Database, seed: u64, rng: &mut SplitMix64) -> Option<Scenario> {
        let users: Vec<_> = db.users.values().collect();
        let user = *rng.pick(&users);
        let orders: Vec<_> = user.orders.iter().map(|o| &db.orders[o]).collect();
        let of_status = |status: &str| -> Vec<_> {
            orders
                .iter()
                .copied()
                .filter(|o| o.status == status)
                .collect()
        };
        let new_address = |rng: &mut SplitMix64| {
            let other = db
                .users
                .values()
                .nth(rng.below(db.users.len() as u64) as usize)?;
            (other.address.zip != user.address.zip).then(|| other.address.clone())
        };
        let name = format!("{} {}", user.first_name, user.last_name);
        let (request, goal, actions, outputs) = match rng.below(6) {
            0 => {
                let pending = of_status("pending");
                let o = *pending.get(rng.below(pending.len().max(1) as u64) as usize)?;
                let reason = rng.pick(&CANCEL_REASONS).to_string();
                let why = if reason == "no longer needed" {
                    "you no longer need it"
                } else {
                    "you ordered it by mistake"
                };
                (
                    Request::Cancel {
                        order_id: o.order_id.clone(),
                        reason: reason.clone(),
                    },
                    format!("cancel your order {} because {why}", o.order_id),
                    vec![action(
                        "cancel_pending_order",
                        json!({"order_id": o.order_id, "reason": reason}),
                    )],
                    vec![],
                )
            }
            1 => {
                let pending = of_status("pending");
                let o = *pending.get(rng.below(pending.len().max(1) as u64) as usize)?;
                let a = new_address(rng)?;
                (
                    Request::OrderAddress {
                        order_id: o.order_id.clone(),
                        address: a.clone(),
                    },
                    format!(
                        "have your order {} shipped to {}, {} {} instead",
                        o.order_id, a.street, a.city, a.zip
                    ),
                    vec![action(
                        "modify_pending_order_address",
                        json!({"order_id": o.order_id, "street": a.street, "city": a.city,
                               "zip": a.zip}),
                    )],
                    vec![],
                )
            }
            2 => {
                let a = new_address(rng)?;
                (
                    Request::UserAddress { address: a.clone() },
                    format!(
                        "change your account's address to {}, {} {} (you moved)",
                        a.street, a.city, a.zip
                    ),
                    vec![action(
                        "modify_user_address",
                        json!({"user_id": user.user_id, "street": a.street, "city": a.city,
                               "zip": a.zip}),
                    )],
                    vec![],
                )
            }
            3 => {
                let delivered = of_status("delivered");
                let o = *delivered.get(rng.below(delivered.len().max(1) as u64) as usize)?;
                let item = rng.pick(&o.items);
                let gift = user.payment_methods.iter().find(|m| m.kind == "gift_card");
                let (method, to) = match gift {
                    Some(g) if rng.below(2) == 0 => (g.id.clone(), "your gift card"),
                    _ => (
                        o.payments[0].payment_method_id.clone(),
                        "the original payment method",
                    ),
                };
                (
                    Request::Return {
                        order_id: o.order_id.clone(),
                        item_id: item.item_id.clone(),
                        payment_method_id: method.clone(),
                    },
                    format!(
                        "return the {} ({}) of your order {}, refunded to {to}",
                        item.name,
                        describe(&item.options),
                        o.order_id
                    ),
                    vec![action(
                        "return_delivered_order_items",
                        json!({"order_id": o.order_id, "item_ids": [item.item_id],
                               "payment_method_id": method}),
                    )],
                    vec![],
                )
            }
            4 => {
                let delivered = of_status("delivered");
                let o = *delivered.get(rng.below(delivered.len().max(1) as u64) as usize)?;
                let item = rng.pick(&o.items);
                let product = &db.products[&item.product_id];
                // Another available variant that differs from the item in exactly one option.
                let choices: Vec<_> = product
                    .variants
                    .iter()
                    .filter(|v| v.available && v.item_id != item.item_id)
                    .filter(|v| {
                        v.options
                            .iter()
                            .filter(|(k, val)| item.options.get(*k) != Some(val))
                            .count()
                            == 1
                    })
                    .collect();
                let v = *choices.get(rng.below(choices.len().max(1) as u64) as usize)?;
                let (option, value) = v
                    .options
                    .iter()
                    .find(|(k, val)| item.options.get(*k) != Some(val))
                    .map(|(k, val)| (k.clone(), val.clone()))
                    .expect("exactly one option differs");
                let method = o.payments[0].payment_method_id.clone();
                (
                    Request::Exchange {
                        order_id: o.order_id.clone(),
                        item_id: item.item_id.clone(),
                        product_id: product.product_id.clone(),
                        option: option.clone(),
                        value: value.clone(),
                        new_item_id: v.item_id.clone(),
                        payment_method_id: method.clone(),
                    },
                    format!(
                        "exchange the {} ({}) of your order {} for the same item with {option} \
                         {value}, paying any difference with the original payment method",
                        item.name,
                        describe(&item.options),
                        o.order_id
                    ),
                    vec![action(
                        "exchange_delivered_order_items",
                        json!({"order_id": o.order_id, "item_ids": [item.item_id],
                               "new_item_ids": [v.item_id], "payment_method_id": method}),
                    )],
                    vec![],
                )
            }
            _ => {
                let o = *rng.pick(&orders);
                (
                    Request::OrderTotal {
                        order_id: o.order_id.clone(),
                    },
                    format!(
                        "know how much you paid in total for your order {}",
                        o.order_id
                    ),
                    vec![],
                    vec![dollars(o.total())],
                )
            }
        };
        let (identity, known_by) = if rng.below(2) == 0 {
            (
                Identity::Email {
                    email: user.email.clone(),
                },
                format!("your email is {}", user.email),
            )
        } else {
            (
                Identity::NameZip {
                    first_name: user.first_name.clone(),
                    last_name: user.last_name.clone(),
                    zip: user.address.zip.clone(),
                },
                format!("your zip code is {}", user.address.zip),
            )
        };
        Some(Scenario {
            db_seed: seed,
            user_id: user.user_id.clone(),
            identity,
            instruction: format!("You are {name}; {known_by}. You want to {goal}."),
            request,
            actions,
            outputs,
        })
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
