//! Drawing a scenario from a database: a customer, one request of six kinds that applies to
//! them, its solution and the customer's instruction.

use super::db::{dollars, Address, Database, Order, OrderItem, User};
use super::scenario::{action, describe, Action, Identity, Request, Scenario};
use super::tools::CANCEL_REASONS;
use ooze_core::SplitMix64;
use serde_json::json;

/// A request with the goal as the customer is told it, its solution and the facts to say.
struct Drawn {
    request: Request,
    goal: String,
    actions: Vec<Action>,
    outputs: Vec<String>,
}

/// What one draw picks from.
struct Draw<'a> {
    db: &'a Database,
    user: &'a User,
    orders: Vec<&'a Order>,
}

/// One of `items`, or `None` when there is none.
fn pick<'t, T>(rng: &mut SplitMix64, items: &'t [T]) -> Option<&'t T> {
    items.get(rng.below(items.len().max(1) as u64) as usize)
}

/// One draw of a customer and a request; `None` when the drawn request does not apply to the
/// drawn customer (no pending order to cancel, say).
pub(super) fn scenario(db: &Database, seed: u64, rng: &mut SplitMix64) -> Option<Scenario> {
    let users: Vec<&User> = db.users.values().collect();
    let user = *pick(rng, &users)?;
    let draw = Draw {
        db,
        user,
        orders: user.orders.iter().map(|o| &db.orders[o]).collect(),
    };
    let drawn = match rng.below(6) {
        0 => draw.cancel(rng),
        1 => draw.order_address(rng),
        2 => draw.user_address(rng),
        3 => draw.give_back(rng),
        4 => draw.exchange(rng),
        _ => draw.order_total(rng),
    }?;
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
    let name = format!("{} {}", user.first_name, user.last_name);
    Some(Scenario {
        db_seed: seed,
        user_id: user.user_id.clone(),
        identity,
        instruction: format!("You are {name}; {known_by}. You want to {}.", drawn.goal),
        request: drawn.request,
        actions: drawn.actions,
        outputs: drawn.outputs,
    })
}

/// An item of one of the customer's orders as the customer names it.
fn ordered(item: &OrderItem, order: &Order) -> String {
    format!(
        "the {} ({}) of your order {}",
        item.name,
        describe(&item.options),
        order.order_id
    )
}

impl Draw<'_> {
    fn of_status(&self, status: &str) -> Vec<&Order> {
        self.orders
            .iter()
            .copied()
            .filter(|o| o.status == status)
            .collect()
    }

    /// Another customer's address, in another zip code.
    fn new_address(&self, rng: &mut SplitMix64) -> Option<Address> {
        let users: Vec<&User> = self.db.users.values().collect();
        let other = pick(rng, &users)?;
        (other.address.zip != self.user.address.zip).then(|| other.address.clone())
    }

    fn cancel(&self, rng: &mut SplitMix64) -> Option<Drawn> {
        let o = *pick(rng, &self.of_status("pending"))?;
        let reason = rng.pick(&CANCEL_REASONS).to_string();
        let why = if reason == "no longer needed" {
            "you no longer need it"
        } else {
            "you ordered it by mistake"
        };
        Some(Drawn {
            goal: format!("cancel your order {} because {why}", o.order_id),
            actions: vec![action(
                "cancel_pending_order",
                json!({"order_id": o.order_id, "reason": reason}),
            )],
            request: Request::Cancel {
                order_id: o.order_id.clone(),
                reason,
            },
            outputs: vec![],
        })
    }

    fn order_address(&self, rng: &mut SplitMix64) -> Option<Drawn> {
        let o = *pick(rng, &self.of_status("pending"))?;
        let a = self.new_address(rng)?;
        Some(Drawn {
            goal: format!(
                "have your order {} shipped to {}, {} {} instead",
                o.order_id, a.street, a.city, a.zip
            ),
            actions: vec![action(
                "modify_pending_order_address",
                json!({"order_id": o.order_id, "street": a.street, "city": a.city,
                       "zip": a.zip}),
            )],
            request: Request::OrderAddress {
                order_id: o.order_id.clone(),
                address: a,
            },
            outputs: vec![],
        })
    }

    fn user_address(&self, rng: &mut SplitMix64) -> Option<Drawn> {
        let a = self.new_address(rng)?;
        Some(Drawn {
            goal: format!(
                "change your account's address to {}, {} {} (you moved)",
                a.street, a.city, a.zip
            ),
            actions: vec![action(
                "modify_user_address",
                json!({"user_id": self.user.user_id, "street": a.street, "city": a.city,
                       "zip": a.zip}),
            )],
            request: Request::UserAddress { address: a },
            outputs: vec![],
        })
    }

    /// A return, refunded to the original payment method or the customer's gift card.
    fn give_back(&self, rng: &mut SplitMix64) -> Option<Drawn> {
        let o = *pick(rng, &self.of_status("delivered"))?;
        let item = pick(rng, &o.items)?;
        let gift = self
            .user
            .payment_methods
            .iter()
            .find(|m| m.kind == "gift_card");
        let (method, to) = match gift {
            Some(g) if rng.below(2) == 0 => (g.id.clone(), "your gift card"),
            _ => (
                o.payments[0].payment_method_id.clone(),
                "the original payment method",
            ),
        };
        Some(Drawn {
            goal: format!("return {}, refunded to {to}", ordered(item, o)),
            actions: vec![action(
                "return_delivered_order_items",
                json!({"order_id": o.order_id, "item_ids": [item.item_id],
                       "payment_method_id": method}),
            )],
            request: Request::Return {
                order_id: o.order_id.clone(),
                item_id: item.item_id.clone(),
                payment_method_id: method,
            },
            outputs: vec![],
        })
    }

    /// An exchange for an available variant that differs from the item in exactly one option.
    fn exchange(&self, rng: &mut SplitMix64) -> Option<Drawn> {
        let o = *pick(rng, &self.of_status("delivered"))?;
        let item = pick(rng, &o.items)?;
        let product = &self.db.products[&item.product_id];
        let differing = |v: &super::db::Variant| {
            v.options
                .iter()
                .filter(|(k, val)| item.options.get(*k) != Some(val))
                .map(|(k, val)| (k.clone(), val.clone()))
                .collect::<Vec<_>>()
        };
        let choices: Vec<_> = product
            .variants
            .iter()
            .filter(|v| v.available && v.item_id != item.item_id && differing(v).len() == 1)
            .collect();
        let v = *pick(rng, &choices)?;
        let (option, value) = differing(v).remove(0);
        let method = o.payments[0].payment_method_id.clone();
        Some(Drawn {
            goal: format!(
                "exchange {} for the same item with {option} {value}, paying any difference with \
                 the original payment method",
                ordered(item, o)
            ),
            actions: vec![action(
                "exchange_delivered_order_items",
                json!({"order_id": o.order_id, "item_ids": [item.item_id],
                       "new_item_ids": [v.item_id], "payment_method_id": method}),
            )],
            request: Request::Exchange {
                order_id: o.order_id.clone(),
                item_id: item.item_id.clone(),
                product_id: product.product_id.clone(),
                option,
                value,
                new_item_id: v.item_id.clone(),
                payment_method_id: method,
            },
            outputs: vec![],
        })
    }

    /// A question: what the customer paid for an order.
    fn order_total(&self, rng: &mut SplitMix64) -> Option<Drawn> {
        let o = *pick(rng, &self.orders)?;
        Some(Drawn {
            request: Request::OrderTotal {
                order_id: o.order_id.clone(),
            },
            goal: format!(
                "know how much you paid in total for your order {}",
                o.order_id
            ),
            actions: vec![],
            outputs: vec![dollars(o.total())],
        })
    }
}
