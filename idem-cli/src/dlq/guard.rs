//! What keeps a look at a dead-letter queue from making things worse: a quorum queue counts
//! every letter given back toward its delivery limit, so a look that gives letters back first
//! reads that limit; and replays of one queue take turns, through a lock the broker holds.

use idem_rabbitmq::lapin::options::QueueDeclareOptions;
use idem_rabbitmq::lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use idem_rabbitmq::lapin::types::FieldTable;
use idem_rabbitmq::lapin::{self, Connection};
use idem_rabbitmq::{AmqpUrl, QueueKind};

use super::management::Management;
use super::queue::{QueueArgs, answered};
use crate::outcome::Result;
use crate::outcome::{NotFound, Refused};
use crate::output::note;

/// Checks that giving letters back to the queue brings none closer to being dropped: refused
/// (exit 4) when the queue counts them toward a delivery limit, or when the queue is a quorum
/// queue whose limit cannot be read.
pub(super) async fn returns_are_free(args: &QueueArgs) -> Result<()> {
    if args.no_delivery_limit {
        return Ok(());
    }
    let management = Management::of(&args.amqp_url, args.management_url.as_deref())?;
    let unreadable = match management.queue(&args.queue, args.step_limit()).await {
        Ok(facts) => {
            return match facts.delivery_limit {
                None => Ok(()),
                Some(limit) => Err(Box::new(Refused(limited(&args.queue, limit)))),
            };
        }
        Err(error) if error.is::<NotFound>() => return Err(error),
        Err(unreadable) => unreadable,
    };
    // Without the management API, AMQP still tells a classic queue, which counts nothing.
    let url = AmqpUrl::new(args.amqp_url.as_str());
    let telling = idem_rabbitmq::amqp::queue_kind(&url, &args.queue, "idem dlq");
    match answered(args.step_limit(), "telling the queue's type", telling).await? {
        QueueKind::Classic => Ok(()),
        _ => Err(Box::new(Refused(format!(
            "{queue} is a quorum queue, whose delivery limit cannot be read ({unreadable}). A \
             look gives back every letter it reads, which a quorum queue counts toward that \
             limit, and past it the letter is dropped. Nothing was read: give the management API \
             (--management-url, a user with the monitoring tag), or --no-delivery-limit once you \
             checked that the queue has none (RabbitMQ 4 gives each quorum queue a limit of 20 \
             unless its arguments or policy set -1)",
            queue = args.queue
        )))),
    }
}

/// Why a look at `queue`, whose delivery limit is `limit`, is refused.
fn limited(queue: &str, limit: i64) -> String {
    format!(
        "{queue} is a quorum queue with a delivery limit of {limit}: a look gives back every \
         letter it reads, which the broker counts toward that limit, and past it drops the \
         letter. Nothing was read. To look at it, lift the limit (RabbitMQ 4: a policy \
         {{\"delivery-limit\": -1}} on the queue; RabbitMQ 3: no x-delivery-limit argument and no \
         delivery-limit in its policies), or move its letters without looking (`idem dlq \
         replay` without --reason gives none back)"
    )
}

/// Takes the lock of replays of `queue` on `connection`: an exclusive queue the broker keeps
/// while the connection lives, so that a replay killed or cut off frees it. Refused (exit 4)
/// while another replay holds it. A user the broker does not let declare it replays without it,
/// warned.
pub(super) async fn take_replay_lock(
    connection: &Connection,
    queue: &str,
    limit: std::time::Duration,
) -> Result<()> {
    let channel = answered(limit, "opening a channel", connection.create_channel()).await?;
    let options = QueueDeclareOptions {
        exclusive: true,
        auto_delete: true,
        ..QueueDeclareOptions::default()
    };
    let lock = format!("idem.replay-lock.{queue}");
    let declaring = channel.queue_declare(lock.as_str().into(), options, FieldTable::default());
    match tokio::time::timeout(limit, declaring).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(error)) if refused_as(&error, AMQPSoftError::RESOURCELOCKED) => {
            Err(Box::new(Refused(format!(
                "another replay of {queue} is running (it holds the queue {lock}): nothing was \
                 moved; run this one once it is done"
            ))))
        }
        Ok(Err(error)) if refused_as(&error, AMQPSoftError::ACCESSREFUSED) => {
            note!(
                "idem: this user may not declare {lock}, which keeps two replays of {queue} \
                 from running at once: make sure no other replay runs"
            );
            Ok(())
        }
        Ok(Err(error)) => Err(format!("taking the replay lock {lock}: {error}").into()),
        Err(_) => Err(super::queue::unanswered(limit, "taking the replay lock")),
    }
}

/// Whether the broker refused an operation with the channel error `kind`.
fn refused_as(error: &lapin::Error, kind: AMQPSoftError) -> bool {
    matches!(
        error.kind(),
        lapin::ErrorKind::ProtocolError(amqp)
            if matches!(amqp.kind(), AMQPErrorKind::Soft(soft) if *soft == kind)
    )
}
