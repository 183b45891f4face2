"""flash_attn 2.x's ``flash_attn.layers`` names that model code imports: ``rotary``
(``apply_rotary_emb``)."""
