//! Rate limits and admission stores (in progress).
