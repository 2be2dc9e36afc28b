//! The account's interruption queue: the SQS queue that EventBridge rules fill with spot
//! interruption warnings, rebalance recommendations, instance state changes and AWS Health
//! scheduled changes (docs/spot.md has the rules and the IAM policy), read as Karpenter reads
//! it. Each message is deleted once the controller has acted on its notices; a message that is
//! not one of those events is deleted at once with a warning (it would come back forever
//! otherwise). Calls go through the account's one retry layer and rate limiter
//! ([`crate::providers::politeness`]); the SDK's own retries are off.

use super::error;
use super::events;
use crate::providers::{Delivery, ProviderError};
use aws_sdk_sqs::types::DeleteMessageBatchRequestEntry;
use std::sync::{Arc, Mutex};

/// SQS returns at most this many messages per call.
const BATCH: i32 = 10;
/// Calls per pass at most: a burst of notices larger than this is read over the next passes.
const MAX_CALLS_PER_PASS: usize = 10;

/// One account's interruption queue.
#[derive(Debug, Clone)]
pub struct InterruptionQueue {
    sqs: aws_sdk_sqs::Client,
    account: String,
    /// The queue's name or URL, from the provider config.
    queue: String,
    /// The URL, once known (a name is looked up on first use); shared by clones.
    url: Arc<Mutex<Option<String>>>,
}

impl InterruptionQueue {
    /// The queue `queue` (a name, or an `https://` URL) of `account`, reached with `config`.
    pub fn new(config: &aws_config::SdkConfig, account: &str, queue: &str) -> Self {
        let known = queue.starts_with("https://") || queue.starts_with("http://");
        Self {
            sqs: aws_sdk_sqs::Client::new(config),
            account: account.to_string(),
            queue: queue.to_string(),
            url: Arc::new(Mutex::new(known.then(|| queue.to_string()))),
        }
    }

    fn err<E>(
        &self,
        op: &'static str,
        e: aws_sdk_sqs::error::SdkError<E, aws_sdk_sqs::config::http::HttpResponse>,
    ) -> ProviderError
    where
        E: aws_sdk_sqs::error::ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        error::from_sdk(op, &self.account, "", e)
    }

    async fn url(&self) -> Result<String, ProviderError> {
        if let Some(url) = self.url.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return Ok(url);
        }
        let out = self
            .sqs
            .get_queue_url()
            .queue_name(&self.queue)
            .send()
            .await
            .map_err(|e| self.err("GetQueueUrl", e))?;
        let url = out.queue_url().unwrap_or_default().to_string();
        *self.url.lock().unwrap_or_else(|p| p.into_inner()) = Some(url.clone());
        Ok(url)
    }

    /// The messages waiting now (no long poll: the controller asks once per pass), each with its
    /// notices; a message that is no event of the queue comes with none, so it is deleted.
    pub async fn receive(&self) -> Result<Vec<Delivery>, ProviderError> {
        let url = self.url().await?;
        let mut out = Vec::new();
        for _ in 0..MAX_CALLS_PER_PASS {
            let page = self
                .sqs
                .receive_message()
                .queue_url(&url)
                .max_number_of_messages(BATCH)
                .wait_time_seconds(0)
                .send()
                .await
                .map_err(|e| self.err("ReceiveMessage", e))?;
            let messages = page.messages();
            for m in messages {
                let Some(receipt) = m.receipt_handle() else { continue };
                let id = m.message_id().unwrap_or("?");
                let notices = events::notices_of(id, m.body().unwrap_or_default()).unwrap_or_else(|e| {
                    tracing::warn!(account = %self.account, error = %e, "deleting a message that is no interruption event");
                    Vec::new()
                });
                out.push(Delivery { receipt: receipt.to_string(), notices });
            }
            if messages.len() < BATCH as usize {
                break;
            }
        }
        Ok(out)
    }

    /// Deletes handled messages, ten per call.
    pub async fn delete(&self, receipts: &[String]) -> Result<(), ProviderError> {
        if receipts.is_empty() {
            return Ok(());
        }
        let url = self.url().await?;
        for chunk in receipts.chunks(BATCH as usize) {
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    DeleteMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(r)
                        .build()
                        .expect("id and receipt handle are set")
                })
                .collect();
            let out = self
                .sqs
                .delete_message_batch()
                .queue_url(&url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| self.err("DeleteMessageBatch", e))?;
            // A failed entry comes back at the end of its visibility timeout and is handled (as
            // already handled) again: worth a warning, not an error.
            for f in out.failed() {
                tracing::warn!(account = %self.account, code = f.code(), message = ?f.message(), "an interruption message was not deleted");
            }
        }
        Ok(())
    }
}
