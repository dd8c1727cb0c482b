//! `keyrelay ctl`: the admin API client (step 3).
