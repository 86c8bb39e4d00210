//! Unit tests of the translators, one file per translator, sharing the fixtures.

mod blocks_tests;
mod caps_tests;
mod count_tests;
mod request_tests;
mod response_tests;
mod responses_out_tests;
mod responses_request_tests;
mod stream_tests;
mod support;
mod tools_tests;
