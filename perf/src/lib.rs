pub mod payload;
