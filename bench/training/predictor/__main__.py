from bench.training.predictor.train import main

main()
