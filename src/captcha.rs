//! The CaptchaAI wire protocol (stub, being written).
