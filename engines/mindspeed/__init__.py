"""The `mindspeed` family (Ascend): the Megatron engine under MindSpeed's adaptor (`megatron`), MindSpeed's FSDP
engine (`fsdp`), and what both read about the installed MindSpeed / torch_npu pairing (`env`)."""
