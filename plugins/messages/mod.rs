//! The messages dialect and the Responses adapter translators (in progress).
