//! Settings (GUCs) as statements and functions see them: `SET`, `SET LOCAL`, `SHOW`, and the
//! session and transaction-local values behind `set_config` and `current_setting`.

use super::eval::Value;
use super::{Ctx, gone};
use crate::guc::{Guc, Gucs, unrecognized};
use crate::reply::{PgType, SqlError, TransactionStatus, sqlstate};
use crate::sql::SetValue;

impl Ctx<'_> {
    /// `SET`, or `SET LOCAL` (`local`): a local value lasts until the transaction ends, and
    /// outside a block, explicit or implicit (where it would end with the statement),
    /// PostgreSQL warns 25P01.
    pub(super) fn set(
        &mut self,
        name: &str,
        value: &SetValue,
        local: bool,
    ) -> Result<(), SqlError> {
        let guc = Guc::lookup(name)?;
        if let Some(error) = guc.fixed() {
            return Err(error);
        }
        if local && self.transaction() == TransactionStatus::Idle && !self.implicit_block {
            self.notify(&SqlError::warning(
                sqlstate::NO_ACTIVE_SQL_TRANSACTION,
                "SET LOCAL can only be used in transaction blocks",
            ));
        }
        match value {
            SetValue::Value(text) => self.set_guc(&guc, text, local)?,
            SetValue::Default if local => {
                let default = Gucs::default();
                let text = default.show(&guc).unwrap_or_default();
                self.set_guc(&guc, &text, true)?;
            }
            SetValue::Default => {
                let session = self.state.sessions.get_mut(&self.pid).ok_or_else(gone)?;
                session.gucs.reset(&guc);
                if let Some(base) = &mut session.local_base {
                    base.reset(&guc);
                }
            }
        }
        self.reply.command_complete("SET");
        Ok(())
    }

    /// Sets `guc` for the session (`local` false) or until the transaction ends.
    pub(super) fn set_guc(&mut self, guc: &Guc, value: &str, local: bool) -> Result<(), SqlError> {
        let session = self.state.sessions.get_mut(&self.pid).ok_or_else(gone)?;
        if local {
            let mut base = session
                .local_base
                .take()
                .unwrap_or_else(|| session.gucs.clone());
            let set = session.gucs.set(guc, value);
            // A placeholder a local set created exists afterwards, empty (its reset value).
            if set.is_ok()
                && let Guc::Custom(name) = guc
            {
                base.custom.entry(name.clone()).or_default();
            }
            session.local_base = Some(base);
            return set;
        }
        session.gucs.set(guc, value)?;
        if let Some(base) = &mut session.local_base {
            base.set(guc, value)?;
        }
        Ok(())
    }

    pub(super) fn show(&mut self, name: &str) -> Result<(), SqlError> {
        let guc = Guc::lookup(name)?;
        let session = self.state.sessions.get(&self.pid).ok_or_else(gone)?;
        let text = session.gucs.show(&guc).ok_or_else(|| unrecognized(name))?;
        let columns = [(guc.name(), PgType::Text)];
        self.send_result(&columns, &[[Some(text)]], "SHOW");
        Ok(())
    }

    /// The text of `guc`; a missing placeholder is NULL when `missing_ok`, else 42704.
    pub(super) fn setting(
        &self,
        guc: &Guc,
        name: &str,
        missing_ok: bool,
    ) -> Result<Value, SqlError> {
        let session = self.state.sessions.get(&self.pid).ok_or_else(gone)?;
        match session.gucs.show(guc) {
            Some(text) => Ok(Value::Text(text)),
            None if missing_ok => Ok(Value::Null),
            None => Err(unrecognized(name)),
        }
    }
}
